"""The pinned agent's prompt: cut to a token count in whatever tokenizer the model has."""

from __future__ import annotations

import pytest

from graphflow.bench.served import AGENT_TEXT, PinnedAgent, text_of_tokens


def per_char(text: str) -> list[int]:
    return [ord(c) for c in text]


def per_word(text: str) -> list[int]:
    return [len(w) for w in text.split()]


@pytest.mark.parametrize("encode", [per_char, per_word])
@pytest.mark.parametrize("tokens", [1, 7, 64, 400])
def test_the_prompt_is_the_longest_prefix_within_the_count(encode, tokens):
    text = text_of_tokens(encode, tokens)
    assert len(encode(text)) <= tokens
    longer = (AGENT_TEXT * (tokens + 1))[: len(text) + 1]  # one more character of the same text
    assert longer.startswith(text) and len(encode(longer)) > tokens


def test_a_per_character_tokenizer_gets_exactly_the_count():
    assert text_of_tokens(per_char, 64) == AGENT_TEXT[:64]
    assert len(text_of_tokens(per_char, 400)) == 400  # past the text's own length: it repeats


def test_bad_counts_and_texts_are_refused():
    with pytest.raises(ValueError, match="at least 1 token"):
        text_of_tokens(per_char, 0)
    with pytest.raises(ValueError, match="empty"):
        text_of_tokens(per_char, 4, "")
    with pytest.raises(ValueError, match="no prefix"):
        text_of_tokens(lambda t: [0, 0] * len(t), 1, "ab")


def test_the_served_agent_prompt_has_the_asked_tokens(local_client):
    agent = PinnedAgent(local_client, prompt_tokens=12)
    replicas = local_client.cluster.replicas
    got = agent.run(64, replicas[1], holder=replicas[0])
    assert got.trace.context_tokens - 64 <= 12
    assert len(agent.encode(agent.graph.nodes[0].template)) == got.trace.context_tokens - 64


def test_reuse_on_and_off_over_the_same_context_give_the_same_first_token(local_client):
    agent = PinnedAgent(local_client, prompt_tokens=12)
    replicas = local_client.cluster.replicas
    context = agent.context(96)
    on = agent.run(96, replicas[1], holder=replicas[0], context=context)
    off = agent.run(96, replicas[1], context=context)
    assert on.trace.decision != "recompute" and off.trace.prefill_tokens_saved == 0
    assert on.first_token == off.first_token
