import pytest

from pyrodash.prompts import OFFLOAD_TOKEN, PROMPT_SETS, get_prompts, pack


def test_prompt_sets_are_versioned_and_complete():
    for name, p in PROMPT_SETS.items():
        assert p.name == name
        assert "{question}" in p.question_template
        assert "{question}" in p.handoff_template and "{partial}" in p.handoff_template
        assert OFFLOAD_TOKEN in p.offload_system  # P_s defines the control action


def test_qwen_math_template():
    p = get_prompts("qwen-math-v1")
    q = p.question("1+1?")
    assert q.startswith("1+1?\n") and q.endswith("within \\boxed{}.")


def test_messages():
    p = get_prompts("world-v1")
    assert p.slm_messages("Q")[0] == {"role": "system", "content": p.offload_system}
    assert p.slm_messages("Q", offload=False) == p.plain_messages("Q") == [{"role": "user", "content": "Q"}]


def test_pack_drops_the_token():
    assert pack("a\n\nb" + OFFLOAD_TOKEN) == "a\n\nb"


def test_unknown_set():
    with pytest.raises(ValueError, match="unknown prompt set"):
        get_prompts("v0")
