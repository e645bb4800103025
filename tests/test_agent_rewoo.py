"""ReWOO with scripted models: two model calls and concurrent workers on the happy path, prompt tokens against ReAct,
worker failures, the one replan, the text plan reader on hostile input, traces with plans, and a run over real HTTP.
Every scripted model has exactly the replies the behaviour under test needs: an extra model call exhausts it and
shows up as an `llm_error`, so a call too many fails the test."""
import json, threading, time

import pytest

from reach_nb.core import Run, write_trace
from reach_nb.llm.models import OpenAIChat, ScriptedLLM
from reach_nb.llm.server import ModelServer
from reach_nb.agents.react import ReActAgent
from reach_nb.agents.rewoo import MAX_PLAN_CHARS, PLANNER_FORMAT, ReWOOAgent, read_rewoo_plan
from reach_nb.tools import ToolRegistry


class Probe:
    "Tools that record how many run at once and what arguments they were given."
    def __init__(self):
        self.live = self.peak = 0
        self.lock, self.seen = threading.Lock(), []

    def fetch(self, key: str):  # what to fetch
        "Fetch a value after a pause."
        with self.lock: self.live += 1; self.peak = max(self.peak, self.live)
        time.sleep(0.3)
        with self.lock: self.live -= 1
        if key == 'broken': raise RuntimeError('upstream down')
        return f'value-of-{key}'

    def combine(self, a: str, b: str):  # two texts to join
        "Join two texts."
        self.seen.append({'a': a, 'b': b})
        return f'{a} + {b}'

    def registry(self): return ToolRegistry([self.fetch, self.combine])


QUESTION = 'What do x and y give together?'
PLAN = """Plan: fetch x.
#E1 = fetch[x]
Plan: fetch y; it does not need x.
#E2 = fetch[{"key": "y"}]
Plan: join them.
#E3 = combine[{"a": "#E1", "b": "from #E2"}]"""
ANSWER = 'Together: value-of-x + from value-of-y.'


def solver_text(llm, n=-1): return llm.calls[n]['messages'][-1]['content']


def test_happy_path_is_two_model_calls_with_concurrent_and_substituted_evidence():
    probe, llm = Probe(), ScriptedLLM([PLAN, ANSWER])
    run = ReWOOAgent(llm, probe.registry()).run(QUESTION)
    assert (run.stop_reason, run.answer) == ('answer', ANSWER)
    assert (len(llm.calls), run.usage.llm_calls, run.usage.tool_calls) == (2, 2, 3)
    assert probe.peak >= 2  # E1 and E2 ran at the same time
    assert probe.seen == [{'a': 'value-of-x', 'b': 'from value-of-y'}]  # E3 got the evidence, not '#E1'
    groups = {e.task: e.group for e in run.extra if e.type == 'task_start'}
    assert groups['E1'] == groups['E2'] == 1 and groups['E3'] > 1
    assert 'value-of' not in json.dumps(llm.calls[0]['messages'])  # the planner sees no observation
    assert 'Evidence #E3: value-of-x + from value-of-y' in solver_text(llm)
    assert [c['json_mode'] for c in llm.calls] == [False, False]  # a text plan and a plain answer are not JSON
    assert [s.index for s in run.steps] == [1, 2, 3] and run.meta['architecture'] == 'rewoo'
    assert [(t.id, t.deps) for t in run.plans[0].tasks] == [('E1', []), ('E2', []), ('E3', ['E1', 'E2'])]


def test_the_json_plan_form_runs_the_same_way():
    plan = {'thought': 'two fetches, then join', 'plan': [
        {'id': 'E1', 'goal': 'x', 'tool': 'fetch', 'args': {'key': 'x'}},
        {'id': 'E2', 'goal': 'y', 'tool': 'fetch', 'args': {'key': 'y'}},
        {'id': 'E3', 'goal': 'join', 'tool': 'combine', 'args': {'a': '#E1', 'b': 'from #E2'}}]}
    probe, llm = Probe(), ScriptedLLM([json.dumps(plan), json.dumps({'answer': ANSWER})])
    run = ReWOOAgent(llm, probe.registry(), plan_format='json').run(QUESTION)
    assert (run.answer, len(llm.calls), probe.peak >= 2) == (ANSWER, 2, True)
    assert probe.seen == [{'a': 'value-of-x', 'b': 'from value-of-y'}]
    assert [c['json_mode'] for c in llm.calls] == [True, False]
    assert (run.plans[0].note, run.plans[0].tasks[2].deps) == ('two fetches, then join', ['E1', 'E2'])


REGIONS = ['north', 'south', 'east', 'west', 'centre', 'coast', 'hills', 'islands']


def report(region: str):  # a sales region
    "The payment report of one region, day by day (3,000 characters)."
    days = (f"{region} day {d}: {100 + d * 7 % 23} payments, {d % 5} refunds, top channel c{d % 13:02d}. "
            for d in range(1, 60))
    return ''.join(days)[:3000]


def test_prompt_tokens_are_several_times_fewer_than_react_with_large_observations():
    "Eight 3,000-character observations; ReAct calls one tool per turn. Measured: ReAct 38,508, ReWOO 8,309 (x4.6)."
    reg, question, answer = ToolRegistry([report]), 'Which region has the most refunds?', 'The east.'
    plan = '\n'.join(f'Plan: the report of {r}.\n#E{i} = report[{r}]' for i, r in enumerate(REGIONS, 1))
    rewoo = ReWOOAgent(ScriptedLLM([plan, answer]), reg).run(question)
    act = lambda r: json.dumps({'thought': f'Next: {r}.', 'action': {'tool': 'report', 'args': {'region': r}}})
    react_llm = ScriptedLLM([act(r) for r in REGIONS] + [json.dumps({'thought': 'done', 'answer': answer})])
    react = ReActAgent(react_llm, reg).run(question)
    assert (rewoo.answer, react.answer) == (answer, answer)
    assert (rewoo.usage.llm_calls, react.usage.llm_calls) == (2, 9)
    assert (rewoo.usage.tool_calls, react.usage.tool_calls) == (8, 8)
    assert react.usage.prompt_tokens >= 3.5 * rewoo.usage.prompt_tokens


def test_a_worker_failure_is_clear_evidence_and_the_solver_still_answers():
    plan = PLAN.replace('fetch[x]', 'fetch[broken]') + '\nPlan: z too.\n#E4 = fetch[z]'
    probe, llm = Probe(), ScriptedLLM([plan, 'Only y and z are known: value-of-y, value-of-z.'])
    run = ReWOOAgent(llm, probe.registry()).run(QUESTION)
    assert (run.stop_reason, len(llm.calls)) == ('answer', 2)
    assert run.answer == 'Only y and z are known: value-of-y, value-of-z.'
    work = run.steps[1]
    assert [o.ok for o in work.observations] == [False, True, False, True]
    assert work.observations[0].content == "Tool 'fetch' raised RuntimeError: upstream down."
    assert work.observations[2].content.startswith('Not run:') and probe.seen == []  # E3 needed E1: not run
    text = solver_text(llm)
    assert "Evidence #E1 (failed): Error: Tool 'fetch' raised RuntimeError: upstream down." in text
    assert 'Evidence #E3 (not run): it needs E1, which failed.' in text
    assert 'Failed evidence: #E1 (failed), #E3 (not run).' in text
    assert 'Evidence #E4: value-of-z' in text
    assert [g.kind for g in work.safeguards] == ['tool_error', 'tool_error']


def test_replan_on_failure_makes_exactly_one_more_planner_call_and_runs_the_new_plan():
    first = PLAN.replace('fetch[x]', 'fetch[broken]')
    new = '#E1 = fetch[x2]\n#E2 = fetch[y]\n#E3 = combine[{"a": "#E1", "b": "#E2"}]'
    probe, llm = Probe(), ScriptedLLM([first, new, 'value-of-x2 + value-of-y'])
    run = ReWOOAgent(llm, probe.registry(), replan_on_failure=True).run(QUESTION)
    assert (run.stop_reason, run.answer, len(llm.calls)) == ('answer', 'value-of-x2 + value-of-y', 3)
    assert [(p.version, p.index) for p in run.plans] == [(1, 1), (2, 3)]
    replan = llm.calls[1]['messages'][-1]['content']
    assert "Evidence #E1 (failed): Error: Tool 'fetch' raised RuntimeError: upstream down." in replan
    assert 'Failed evidence: #E1 (failed), #E3 (not run).' in replan
    assert probe.seen == [{'a': 'value-of-x2', 'b': 'value-of-y'}]  # the new plan ran, from the start
    assert 'Evidence #E3: value-of-x2 + value-of-y' in solver_text(llm) and 'broken' not in solver_text(llm)
    assert [s.usage.llm_calls for s in run.steps] == [1, 0, 1, 0, 1]


def test_replan_is_bounded_to_one_and_skipped_when_nothing_failed():
    bad = PLAN.replace('fetch[x]', 'fetch[broken]')
    llm = ScriptedLLM([bad, bad, 'x could not be fetched.'])
    run = ReWOOAgent(llm, Probe().registry(), replan_on_failure=True).run(QUESTION)
    assert (run.stop_reason, len(llm.calls), len(run.plans)) == ('answer', 3, 2)  # no second replan
    assert 'Failed evidence: #E1 (failed), #E3 (not run).' in solver_text(llm)
    llm = ScriptedLLM([PLAN, ANSWER])
    run = ReWOOAgent(llm, Probe().registry(), replan_on_failure=True).run(QUESTION)
    assert (run.answer, len(llm.calls), len(run.plans)) == (ANSWER, 2, 1)


def test_a_replanner_without_a_usable_plan_leaves_the_first_evidence_to_the_solver():
    llm = ScriptedLLM([PLAN.replace('fetch[x]', 'fetch[broken]'), 'I cannot plan that.', 'Only y: value-of-y.'])
    run = ReWOOAgent(llm, Probe().registry(), replan_on_failure=True, max_corrections=0).run(QUESTION)
    assert (run.stop_reason, run.answer, len(llm.calls), len(run.plans)) == ('answer', 'Only y: value-of-y.', 3, 1)
    assert 'Evidence #E2: value-of-y' in solver_text(llm)


HOSTILE = [
    ('', 'The reply is empty'),
    ('x' * (MAX_PLAN_CHARS + 1), 'keep it under 20,000'),
    ('[' * 19_000, 'The reply has no plan'),
    ('{"plan": ' + '[' * 5_000 + ']' * 5_000 + '}', None),
    ('#E1 = fetch[' + '{' * 15_000, "does not end with '}]'"),
    ('#E1 = fetch[{"key": ' + '[' * 3_000 + ']' * 3_000 + '}]', 'The arguments of #E1 are not a readable JSON object'),
    ('#E1 = fetch[x\n' * 1_000, "does not end with ']'"),
    ('#E1 = fetch[x]\n' * 1_000, 'more than 20 steps'),
    ('#E' + '9' * 5_000 + ' = fetch[x]', 'a number of 1 to 6 digits'),
    ('#E1 = fetch[#E1]', 'which is not an earlier step'),
    ('#E1 = fetch[#E2]\n#E2 = fetch[y]', '#E1 uses #E2, which is not an earlier step'),
    ('#E1 = fetch[#E9]', '#E1 uses #E9, which no step defines'),
    ('#E1 = fetch[x]\n#E1 = fetch[y]', 'Task ids must be unique'),
    ('#E1 = fetsh[x]', "did you mean 'fetch'?"),
    ('#E1 = fetch[x] #E2 = fetch[y]', 'holds two calls'),
    ('#E1 = ' + 'a' * 10_000 + '[x]', 'is not in the form #E1 = tool[arguments]'),
    ('#E1 = fetch(x)', "Line 1 ('#E1 = fetch(x)') is not in the form #E1 = tool[arguments]"),
    ('Plan: ' + 'think ' * 3_000, 'The reply has no plan'),
]


@pytest.mark.parametrize('text, says', HOSTILE, ids=range(len(HOSTILE)))
def test_the_plan_reader_refuses_malformed_and_hostile_plans_with_a_clear_reason(text, says):
    with pytest.raises(ValueError) as e:
        read_rewoo_plan(text, Probe().registry())
    assert says is None or says in str(e.value)
    assert len(str(e.value)) < 1_500


def test_odd_but_readable_text_is_kept_as_text():
    plan = read_rewoo_plan('#E1 = fetch[\x00 \ud800 x]\n#E2 = combine[{"a": "#E1", "b": "$USD {x}"}]', Probe().registry())
    assert [t.call.args for t in plan.tasks] == [{'_0': '\x00 \ud800 x'}, {'a': '#E1', 'b': '$USD {x}'}]
    assert [t.deps for t in plan.tasks] == [[], ['E1']]


def test_a_plan_that_cannot_be_read_is_corrected_and_nothing_raises():
    llm = ScriptedLLM(['[' * (MAX_PLAN_CHARS + 10), '#E1 = fetch(x)', PLAN, ANSWER])
    run = ReWOOAgent(llm, Probe().registry()).run(QUESTION)
    assert (run.stop_reason, run.answer, len(llm.calls)) == ('answer', ANSWER, 4)
    assert [s.parse_level for s in run.steps] == ['failed', 'failed', 'strict', 'native', 'strict']
    assert [g.kind for g in run.steps[0].safeguards] == ['size_cap', 'correction']
    fix = llm.calls[2]['messages'][-1]['content']
    assert fix.startswith("Your last plan could not be used. Line 1 ('#E1 = fetch(x)') is not in the form")
    assert PLANNER_FORMAT in fix
    never = ScriptedLLM(['#E1 = fetch(x)'] * 3)
    run = ReWOOAgent(never, Probe().registry()).run(QUESTION)
    assert (run.stop_reason, len(never.calls), run.usage.tool_calls) == ('parse_failures', 3, 0)


def test_a_bug_inside_the_agent_ends_the_run_with_an_internal_error():
    class Broken(ToolRegistry):
        def render_prompt(self): raise RuntimeError('no prompt today')
    run = ReWOOAgent(ScriptedLLM([]), Broken([report])).run('q')
    assert (run.stop_reason, run.steps[-1].safeguards[0].kind) == ('error', 'internal_error')
    assert 'no prompt today' in run.steps[-1].safeguards[0].detail


def test_traces_save_and_load_with_their_plans(tmp_path):
    first = PLAN.replace('fetch[x]', 'fetch[broken]')
    agent = ReWOOAgent(ScriptedLLM([first, PLAN, ANSWER]), Probe().registry(), replan_on_failure=True)
    run = agent.run(QUESTION)
    back = Run.load(run.save(tmp_path / 'saved.jsonl'))
    assert (back.answer, back.stop_reason, back.steps, back.plans) == (run.answer, 'answer', run.steps, run.plans)
    assert [p.version for p in back.plans] == [1, 2] and back.plans[1].tasks[2].deps == ['E1', 'E2']
    assert [e.type for e in back.extra].count('task_end') == 6
    agent.llm = ScriptedLLM([first, PLAN, ANSWER])
    live = Run.load(write_trace(agent.stream(QUESTION), tmp_path / 'live.jsonl'))  # the full event stream
    assert (live.answer, [p.tasks for p in live.plans]) == (ANSWER, [p.tasks for p in run.plans])
    assert [s.index for s in live.steps] == [1, 2, 3, 4, 5]


def test_over_http_with_the_openai_client():
    backing = ScriptedLLM([PLAN, ANSWER])
    with ModelServer(backing) as srv:
        llm = OpenAIChat('test-model', base_url=srv.base_url, timeout=5, max_retries=0)
        run = ReWOOAgent(llm, Probe().registry()).run(QUESTION)
    assert (run.stop_reason, run.answer, run.usage.llm_calls) == ('answer', ANSWER, 2)
    assert [c['json_mode'] for c in backing.calls] == [False, False]
    assert 'Evidence #E3: value-of-x + from value-of-y' in backing.calls[1]['messages'][-1]['content']
