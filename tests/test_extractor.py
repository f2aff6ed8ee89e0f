from __future__ import annotations

import json

import pytest

from crl_agent.experience.bank import ExperienceEntry
from crl_agent.experience.extractor import (
    MAX_OPS,
    Trajectory,
    distil_messages,
    extract_json,
    format_trajectory,
    merge_messages,
    parse_answer,
    parse_distil,
    parse_merge,
)


def _entry(i: int, title: str = "Rule", content: str = "If x, then y.") -> ExperienceEntry:
    return ExperienceEntry(i, "crl/T-v0", title, content, 0.0, 0.0)


def _traj(steps: int = 3, retrieved=()) -> Trajectory:
    return Trajectory(
        id="crl/T-v0#0", task="crl/T-v0", goal="push the box onto the goal",
        steps=[(f"observation {i}", f"action {i}") for i in range(steps)],
        success=False, progress=0.5, retrieved=list(retrieved), final_observation="the end",
    )


GOOD = {"operations": [
    {"op": "add", "title": "Corners", "content": "If a box is in a corner, then it can never move again."},
    {"op": "update", "target_ids": [7], "title": "Walls", "content": "If a box is on a wall, then keep it there."},
    {"op": "none"},
]}


def test_distil_prompt_shows_goal_outcome_entries_and_steps():
    msgs = distil_messages(_traj(retrieved=[_entry(7, "Walls", "If on a wall, then ...")]))
    user = msgs[-1]["content"]
    assert msgs[0]["role"] == "system" and "at most 3 operations" in msgs[0]["content"]
    for needle in ("push the box onto the goal", "FAILURE", "#7 Walls", "Step 3", "action 2", "the end"):
        assert needle in user


def test_long_trajectories_keep_head_and_tail_and_say_what_was_cut():
    text = format_trajectory(_traj(steps=200), max_chars=2000)
    assert "Step 1\n" in text and "Step 200\n" in text and "steps omitted" in text
    assert len(text) < 2600


def test_clean_json_yields_add_update_none():
    ops, errors = parse_distil(json.dumps(GOOD), valid_ids={7})
    assert errors == []
    assert [o.kind for o in ops] == ["add", "update", "none"]
    assert ops[1].target_ids == [7] and ops[0].entry.title == "Corners"


@pytest.mark.parametrize(
    "wrap",
    [
        lambda s: f"Sure! Here you go:\n```json\n{s}\n```\nHope it helps.",
        lambda s: f"<think>the box... {{not json}}</think>\n{s}",
        lambda s: f"reasoning without an opening tag </think> {s}",
        lambda s: "Answer: " + s.replace("}]}", "},]}"),  # trailing comma
        lambda s: s.replace('"', "'"),  # python-style quotes
        lambda s: "```\n" + s,  # unterminated fence
    ],
)
def test_lenient_json_extraction_survives_small_model_habits(wrap):
    ops, errors = parse_distil(wrap(json.dumps(GOOD)), valid_ids={7})
    assert [o.kind for o in ops] == ["add", "update", "none"], errors


def test_top_level_list_single_object_and_nested_entry_are_accepted():
    ops, _ = parse_distil(json.dumps([{"op": "ADD", "entry": {"title": "T", "content": "If a, then b."}}]), set())
    assert ops[0].kind == "add" and ops[0].entry.content == "If a, then b."
    ops, _ = parse_distil('{"operation": "update", "target_id": "#7", "title": "T", "content": "If a, then b."}', {7})
    assert ops[0].kind == "update" and ops[0].target_ids == [7]


@pytest.mark.parametrize(
    "text, error",
    [
        ("I learned nothing today.", "malformed"),
        ("{broken json", "malformed"),
        ('{"operations": [{"op": "delete_everything"}]}', "unknown op"),
        ('{"operations": [{"op": "update", "target_ids": [99], "title": "T", "content": "C"}]}', "not among"),
        ('{"operations": [{"op": "update", "target_ids": ["abc"], "title": "T", "content": "C"}]}', "bad or missing"),
        ('{"operations": [{"op": "add", "title": "", "content": "C"}]}', "missing title"),
        ('{"operations": [42]}', "not an object"),
        ('"just a string"', "malformed"),
    ],
)
def test_malformed_output_is_reported_and_skipped(text, error):
    ops, errors = parse_distil(text, valid_ids={7})
    assert ops == [] and any(error in e for e in errors), errors


def test_more_than_three_ops_are_truncated_with_an_error():
    many = {"operations": [{"op": "add", "title": f"T{i}", "content": f"If {i}, then go."} for i in range(5)]}
    ops, errors = parse_distil(json.dumps(many), set())
    assert len(ops) == MAX_OPS and "only the first 3" in errors[0]


def test_overlong_fields_are_clipped():
    ops, _ = parse_distil(json.dumps([{"op": "add", "title": "x" * 500, "content": "y " * 2000}]), set())
    assert len(ops[0].entry.title) <= 120 and len(ops[0].entry.content) <= 800


def test_merge_decisions_parse_and_unsafe_ones_become_keep():
    ids = [1, 2, 3]
    d, err = parse_merge('{"op": "MERGE", "title": "T", "content": "If a, then b."}', ids)
    assert d.kind == "MERGE" and d.entries[0].title == "T" and not err
    d, _ = parse_merge('{"op": "rewrite", "entries": [{"title": "A", "content": "c1"}, {"title": "B", "content": "c2"}]}', ids)
    assert d.kind == "REWRITE" and [e.title for e in d.entries] == ["A", "B"]
    d, _ = parse_merge('{"op": "DISCARD", "target_ids": [2, 3]}', ids)
    assert d.kind == "DISCARD" and d.discard_ids == [2, 3]
    for bad in ('{"op": "DISCARD", "target_ids": [1, 2, 3]}', '{"op": "DISCARD", "target_ids": [9]}',
                '{"op": "MERGE"}', '{"op": "SHRED"}', "no json", '{"op": "REWRITE", "entries": []}'):
        d, err = parse_merge(bad, ids)
        assert d.kind == "KEEP" and err, bad
    assert parse_merge('{"op": "KEEP"}', ids) == (parse_merge('{"op": "KEEP"}', ids)[0], [])


def test_merge_and_answer_prompts_list_the_entries():
    cluster = [_entry(1, "A"), _entry(2, "B")]
    assert "#1 A" in merge_messages("t", cluster)[-1]["content"]
    assert "MERGE" in merge_messages("t", cluster)[0]["content"]


def test_answer_parser_strips_thinking_tags_and_fences():
    assert parse_answer("<think>hmm</think>\n<answer>Go left first.</answer>") == "Go left first."
    assert parse_answer("```\nTry the key.\n```") == "Try the key."
    assert parse_answer("<think>only thoughts</think>") == ""


def test_extract_json_finds_an_object_after_prose_with_braces_in_strings():
    assert extract_json('note {not json} then {"a": "x}y", "b": [1, 2]} end') == {"a": "x}y", "b": [1, 2]}


def test_prose_if_then_sentences_become_adds_but_still_count_as_malformed():
    text = "The agent should learn this. If a box is in a corner, then the level is lost. Also fun."
    ops, errors = parse_distil(text, set())
    assert [o.kind for o in ops] == ["add"] and ops[0].entry.content.startswith("If a box is in a corner")
    assert ops[0].entry.title and "malformed" in errors[0]


def test_distil_prompt_demonstrates_the_format_once():
    msgs = distil_messages(_traj(), example=True)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert parse_distil(msgs[2]["content"], valid_ids={3})[1] == []  # the demonstration itself parses cleanly
    assert [m["role"] for m in distil_messages(_traj(), example=False)] == ["system", "user"]
