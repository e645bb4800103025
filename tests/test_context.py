"""Prompts built from the steps: for every context policy, in JSON and native mode, through corrections, repeats
and the step limit, the prompt rebuilt from a saved trace equals, message for message, what the model was sent."""
import json
import pytest
from reach_nb.llm.context import Full, Layered, Window, get_policy
from reach_nb.core import Run, ToolCall
from reach_nb.llm.models import LLMResponse, ScriptedLLM
from reach_nb.agents.react import ReActAgent


def lookup(key:str): # what to look up
    "Look a key up in the table."
    return f"row {key}: " + ' '.join(f'{key}{j}={j * 7 % 13}' for j in range(80))


def _json_script(n:int) -> list:
    calls = [json.dumps({'thought': f'Look {i}.', 'action': {'tool': 'lookup', 'args': {'key': f'k{i}'}}}) for i in range(n)]
    return calls[:2] + ['not json at all'] + calls[2:] + [calls[-1]] + [json.dumps({'thought': 'Enough.', 'answer': 'k3'})]


def _native_script(n:int) -> list:
    return [LLMResponse(tool_calls=[ToolCall(tool='lookup', args={'key': f'k{i}'})]) for i in range(n)] + ['k3']


POLICIES = ['full', 'window:2', 'layered:1', Layered(k=1, budget=1200)]


@pytest.mark.parametrize('policy', POLICIES, ids=str)
@pytest.mark.parametrize('mode', ['json', 'native'])
@pytest.mark.parametrize('max_steps', [4, 12])
def test_rebuilt_prompt_equals_what_was_sent(policy, mode, max_steps, tmp_path):
    llm = ScriptedLLM(_json_script(6) if mode == 'json' else _native_script(6))
    run = ReActAgent(llm, [lookup], mode=mode, context=policy, max_steps=max_steps).run('Which key?')
    assert len(run.steps) == len(llm.calls)
    loaded = Run.load(run.save(tmp_path/'run.jsonl'))
    for k, step in enumerate(loaded.steps):
        assert loaded.prompt_at(step.index) == llm.calls[k]['messages'], f'step {step.index}'
    assert all(not s.prompt for s in loaded.steps)  # the trace keeps what each step added, not whole prompts


def test_streamed_runs_rebuild_too(tmp_path):
    llm = ScriptedLLM(_json_script(4))
    run = ReActAgent(llm, [lookup], context='layered:1', stream_tokens=True).run('Which key?')
    assert [run.prompt_at(s.index) for s in run.steps] == [c['messages'] for c in llm.calls]


def test_a_trace_grows_linearly_not_with_the_square_of_the_run(tmp_path):
    def size(n):
        llm = ScriptedLLM([json.dumps({'thought': '.', 'action': {'tool': 'lookup', 'args': {'key': f'k{i}'}}}) for i in range(n)]
                          + [json.dumps({'answer': 'done'})])
        return ReActAgent(llm, [lookup], max_steps=n + 1).run('q').save(tmp_path/f'{n}.jsonl').stat().st_size
    small, big = size(10), size(40)
    assert big < 5 * small  # four times the steps, about four times the bytes (a stored prompt per step: ~16x)


def test_layered_keeps_prompts_flat_and_small():
    llm = ScriptedLLM([json.dumps({'thought': '.', 'action': {'tool': 'lookup', 'args': {'key': f'k{i}'}}}) for i in range(30)]
                      + [json.dumps({'answer': 'done'})])
    run = ReActAgent(llm, [lookup], max_steps=31, context='layered').run('q')
    tokens = [s.usage.prompt_tokens for s in run.steps]
    assert max(tokens) <= 5000 and tokens[-1] - tokens[15] < 600  # flat once the window is full
    full = ReActAgent(ScriptedLLM(llm.responses), [lookup], max_steps=31).run('q')
    assert full.steps[-1].usage.prompt_tokens > 3 * tokens[-1]


def test_every_layered_step_has_its_summary_in_the_trace():
    llm = ScriptedLLM(_json_script(4))
    run = ReActAgent(llm, [lookup], context='layered').run('q')
    assert all(s.summary and len(s.summary) <= 200 for s in run.steps)
    plain = ReActAgent(ScriptedLLM(_json_script(4)), [lookup]).run('q')
    assert all(s.summary is None for s in plain.steps)  # full needs none, so none are made


def test_a_failing_summariser_is_a_safeguard_not_a_crash():
    def broken(step, earlier): raise RuntimeError('summariser down')
    run = ReActAgent(ScriptedLLM(_json_script(3)), [lookup], context='layered', summariser=broken).run('q')
    assert run.stop_reason == 'answer'
    assert any(g.kind == 'internal_error' and 'summariser down' in g.detail for s in run.steps for g in s.safeguards)


def test_policy_specs():
    assert get_policy('window:3') == Window(3) and get_policy(None) == Full()
    with pytest.raises(ValueError, match='choose one of'): get_policy('sliding')
    with pytest.raises(ValueError, match="give a number of steps"): get_policy('window:many')
