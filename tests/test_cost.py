import pytest

from pyrodash.cli import main
from pyrodash.cost import (
    Prices,
    Usage,
    grpo_cost_actual,
    grpo_cost_base,
    grpo_efficiency,
    grpo_total_reward,
    llm_token_ratio,
    normalized_cost,
)

M = 1_000_000


@pytest.fixture
def paper() -> Prices:
    return Prices.from_yaml("paper")


def test_paper_sheet(paper):
    assert paper == Prices(0.05, 0.08, 0.90, 2.86)


@pytest.mark.parametrize(
    "counts, dollars",
    [
        (dict(slm_in=0.60, slm_out=27.86), 2.26),  # Qwen3.5-4B alone
        (dict(slm_in=0.71, slm_out=12.07, llm_in=0.13, llm_out=0.23), 1.78),  # PyroDash lambda=0.6
        (dict(llm_in=0.57, llm_out=17.08), 49.36),  # GLM-5.2-FP8 alone
    ],
)
def test_table4_totals(paper, counts, dollars):
    usage = Usage(**{k: round(v * M) for k, v in counts.items()})
    assert round(usage.cost(paper), 2) == dollars


def test_add_and_sum():
    a, b = Usage(1, 2, 3, 4, 1, 1), Usage(10, 20, 30, 40, 0, 0)
    assert a + b == Usage(11, 22, 33, 44, 1, 1)
    assert sum([a, b]) == a + b
    assert sum([], Usage()) == Usage()


def test_cached_input_billing(paper):
    u = Usage(llm_in=M, llm_cached_in=M // 2)
    assert u.cost(paper) == pytest.approx(0.90)  # no cached price in the sheet: billed at llm_in
    cached = Prices.from_yaml("cached")
    assert u.cost(cached) == pytest.approx(0.45 + 0.045)
    # more cached than input tokens (a provider's odd report): every input token cached, never a negative bill
    assert Usage(llm_in=M, llm_cached_in=3 * M).cost(cached) == pytest.approx(
        Usage(llm_in=M, llm_cached_in=M).cost(cached)
    )


def test_token_ratio_and_normalised(paper):
    us = [Usage(slm_out=90, llm_out=10), Usage(slm_out=0, llm_out=0)]
    assert llm_token_ratio(us) == pytest.approx(0.1)
    assert llm_token_ratio([Usage()]) == 0.0
    base = [Usage(llm_in=100, llm_out=1000)]
    assert normalized_cost(base, base, paper) == pytest.approx(1.0)
    assert normalized_cost([Usage(slm_out=1000)], base, paper) < 0.05


def test_grpo_accounting(paper):
    base = grpo_cost_base(t_in=100, t_llm_dec=400, prices=paper)
    assert base == pytest.approx((0.90 * 100 + 2.86 * 400) / M)
    act = grpo_cost_actual(t_slm=50, t_llm_dec=100, prices=paper)
    assert act == pytest.approx(((0.08 + 0.90) * 50 + 2.86 * 100) / M)
    solo = grpo_cost_actual(t_slm=50, t_llm_dec=0, prices=paper, handoff=False)
    assert solo == pytest.approx(0.08 * 50 / M)
    r_eff = grpo_efficiency(act, base)
    assert 0 < r_eff < 1
    assert grpo_total_reward(1.0, r_eff, 0.6) == pytest.approx(1 - 0.6 * r_eff)
    with pytest.raises(ValueError):
        grpo_efficiency(act, 0.0)
    with pytest.raises(ValueError):
        grpo_cost_actual(t_slm=5, t_llm_dec=3, prices=paper, handoff=False)


def test_bad_prices(tmp_path):
    with pytest.raises(ValueError, match="non-negative"):
        Prices(-1, 0, 0, 0)
    bad = tmp_path / "bad.yaml"
    bad.write_text("slm_in: 1\nslm_out: 1\nllm_in: 1\nllm_out: 1\nfoo: 2\n")
    with pytest.raises(ValueError, match="unknown keys"):
        Prices.from_yaml(bad)
    with pytest.raises(ValueError, match="not found"):
        Prices.from_yaml("nope")


def test_cost_cli(capsys):
    assert main(["cost", "--llm-in", "0.57", "--llm-out", "17.08", "--millions"]) == 0
    assert "$49.36" in capsys.readouterr().out
    assert main(["cost", "--prices", "missing-sheet"]) == 2
    assert "not found" in capsys.readouterr().err
