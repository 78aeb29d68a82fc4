"""`LazyDeadline`: one timer bounds each wait of a series, never the series (the engine's LLM chunk timeout and the
lean HTTP client's read timeout share it)."""

import asyncio

from pyrodash.backends.deadline import LazyDeadline


def test_each_wait_is_bounded_not_the_series():
    async def main():
        expired = []
        d = LazyDeadline(asyncio.get_running_loop(), lambda: expired.append(True))
        for _ in range(8):  # 8 waits of 0.05 s under 0.2 s each: 0.4 s in all, the timer re-arms, never expires
            d.start(0.2)
            await asyncio.sleep(0.05)
            d.stop()
            await asyncio.sleep(0.01)  # time between waits never counts
        assert expired == []
        d.start(0.1)  # a wait that outlasts its own deadline expires, once
        await asyncio.sleep(0.3)
        d.stop()
        d.close()
        return expired

    assert asyncio.run(main()) == [True]


def test_close_cancels_the_timer():
    async def main():
        expired = []
        d = LazyDeadline(asyncio.get_running_loop(), lambda: expired.append(True))
        d.start(0.05)
        d.close()
        await asyncio.sleep(0.15)
        return expired

    assert asyncio.run(main()) == []
