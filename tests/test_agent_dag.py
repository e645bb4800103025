"""The DAG agent (LLMCompiler-style) through its public API, with scripted models and tools that sleep and count how
many of them run at once. Each test names the behaviour it pins down; the notebook `25_dag` shows the same with its
code. No test asserts on wall time: concurrency is counted, order is read from the events."""
import json, threading, time

import pytest

from reach_nb.core import Run
from reach_nb.agents.dag import DAGAgent, LatencyLLM, read_dag
from reach_nb.llm.models import ScriptedLLM
from reach_nb.tools import ToolRegistry

say = json.dumps


class Meter:
    "A tool that sleeps, fails on 'boom…', and counts how many of its calls run at once (`peak`)."
    def __init__(self, pause: float = 0.3):
        self.pause, self.live, self.peak, self.lock = pause, 0, 0, threading.Lock()

    def fn(self):
        def slow(x: str):  # what to echo
            "Echo `x` after a pause."
            with self.lock: self.live += 1; self.peak = max(self.peak, self.live)
            try:
                time.sleep(self.pause)
                if x.startswith('boom'): raise RuntimeError(f'{x} is down')
                return f'seen {x}'
            finally:
                with self.lock: self.live -= 1
        return slow


def task(id, x, deps=()): return {'id': id, 'goal': f'find {x}', 'tool': 'slow', 'args': {'x': x}, 'deps': list(deps)}
def plan(*tasks, thought='the plan'): return say({'thought': thought, 'plan': list(tasks)})
def answer(text): return say({'thought': 'enough', 'decision': 'answer', 'answer': text})
def replan(why): return say({'thought': 'not enough', 'decision': 'replan', 'reason': why})
def lines(*tasks): return '\n'.join([say({'thought': 'line by line'}), *map(say, tasks)])
def of(run, kind): return [e for e in run.extra if e.type == kind]
def obs(run, index):
    step = next(s for s in run.steps if s.index == index)
    return {a.id: (o.ok, o.content) for a, o in zip(step.actions, step.observations)}


# --- tasks that do not need each other run at the same time -----------------------------------------------------

def test_independent_tasks_run_concurrently():
    m = Meter(0.3)
    llm = ScriptedLLM([plan(task('a', 'a'), task('b', 'b'), task('c', 'c')), answer('a, b and c')])
    run = DAGAgent(llm, [m.fn()], max_parallel=4).run('Q?')
    work = run.steps[1].usage.wall_time  # reported, not asserted: about one pause, not three
    assert m.peak == 3, f'peak {m.peak}, work step took {work:.2f}s for 3 calls of {m.pause}s'
    assert {e.task: e.group for e in of(run, 'task_start')} == {'a': 1, 'b': 1, 'c': 1}
    assert (run.answer, run.stop_reason, run.usage.llm_calls, run.usage.tool_calls) == ('a, b and c', 'answer', 2, 3)


def test_max_parallel_is_respected():
    m = Meter(0.15)
    tasks = [task(f't{i}', str(i)) for i in range(6)]
    run = DAGAgent(ScriptedLLM([plan(*tasks), answer('done')]), [m.fn()], max_parallel=2).run('Q?')
    assert m.peak == 2 and run.usage.tool_calls == 6
    assert sorted(e.task for e in of(run, 'task_end')) == [f't{i}' for i in range(6)]


def test_max_parallel_is_respected_when_the_plan_streams():
    m = Meter(0.15)
    tasks = [task(f't{i}', str(i)) for i in range(6)]
    run = DAGAgent(ScriptedLLM([lines(*tasks), answer('done')]), [m.fn()], max_parallel=2, stream_plan=True).run('Q?')
    assert m.peak == 2 and run.usage.tool_calls == 6 and run.stop_reason == 'answer'


def test_a_reference_in_the_arguments_makes_a_dependency():
    llm = ScriptedLLM([plan(task('a', 'a'), task('b', 'after {a}')), answer('ok')])  # b lists no deps
    run = DAGAgent(llm, [Meter(0.05).fn()]).run('Q?')
    groups = {e.task: e.group for e in of(run, 'task_start')}
    assert groups == {'a': 1, 'b': 2} and run.plans[0].tasks[1].deps == ['a']
    assert obs(run, 2)['b'] == (True, 'seen after seen a')


# --- a failed branch does not stop the others ----------------------------------------------------------------------

def test_a_failed_branch_leaves_the_unrelated_branch_running_and_the_join_answers():
    llm = ScriptedLLM([plan(task('bad', 'boom'), task('needs_bad', 'x', ['bad']), task('good', 'g'),
                            task('after_good', 'h', ['good'])), answer('g and h were found; the rest is down')])
    run = DAGAgent(llm, [Meter(0.1).fn()]).run('Q?')
    got = obs(run, 2)
    assert got['bad'] == (False, "Tool 'slow' raised RuntimeError: boom is down.")
    assert got['needs_bad'] == (False, 'Not run: it needs bad, which failed.')
    assert got['good'] == (True, 'seen g') and got['after_good'] == (True, 'seen h')
    started = {e.task for e in of(run, 'task_start')}
    assert 'after_good' in started and 'needs_bad' not in started
    join_prompt = llm.calls[1]['messages'][1]['content']
    assert '-> ok: seen g' in join_prompt and '-> failed: Tool' in join_prompt
    assert (run.answer, run.stop_reason) == ('g and h were found; the rest is down', 'answer')


def test_everything_below_a_failure_is_reported():
    llm = ScriptedLLM([plan(task('bad', 'boom'), task('b', 'x', ['bad']), task('c', 'y', ['b'])), answer('down')])
    run = DAGAgent(llm, [Meter(0.01).fn()]).run('Q?')
    assert sorted(obs(run, 2)) == ['b', 'bad', 'c']


def test_everything_below_a_failure_is_reported_when_the_plan_streams():
    llm = ScriptedLLM([lines(task('bad', 'boom'), task('b', 'x', ['bad']), task('c', 'y', ['b'])), answer('down')])
    run = DAGAgent(llm, [Meter(0.01).fn()], stream_plan=True).run('Q?')
    assert obs(run, 2)['c'] == (False, 'Not run: it needs b, which failed.')
    assert sorted(e.task for e in of(run, 'task_end')) == ['b', 'bad', 'c']


# --- the join answers or replans ---------------------------------------------------------------------------------

def test_a_join_that_replans_once_makes_plan_version_2():
    llm = ScriptedLLM([plan(task('a', 'orders')), replan('refunds are missing'),
                       plan(task('r', 'refunds'), thought='now the refunds'), answer('orders and refunds')])
    run = DAGAgent(llm, [Meter(0.01).fn()]).run('Q?')
    assert [(p.version, p.index, p.note) for p in run.plans] == [(1, 1, 'the plan'), (2, 4, 'now the refunds')]
    assert [s.index for s in run.steps] == [1, 2, 3, 4, 5, 6]
    replanner = llm.calls[2]['messages'][1]['content']
    assert 'seen orders' in replanner and 'refunds are missing' in replanner
    last_join = llm.calls[3]['messages'][1]['content']
    assert 'Plan 1:' in last_join and 'seen refunds' in last_join
    assert (run.answer, run.stop_reason, run.usage.llm_calls) == ('orders and refunds', 'answer', 4)


def test_replans_are_bounded():
    llm = ScriptedLLM([plan(task('a', 'a')), replan('more'), plan(task('b', 'b')), replan('still more')])
    run = DAGAgent(llm, [Meter(0.01).fn()], max_replans=1).run('Q?')
    assert [p.version for p in run.plans] == [1, 2] and run.stop_reason == 'max_steps'
    assert [g.kind for g in run.steps[-1].safeguards] == ['max_steps']
    assert 'seen a' in run.answer and 'seen b' in run.answer
    assert 'No new plan can be made now' in llm.calls[3]['messages'][0]['content']  # the last join was told


# --- traces ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('stream_plan', [False, True])
def test_a_saved_trace_loads_with_its_plans_and_task_events(tmp_path, stream_plan):
    first = lines(task('a', 'a'), task('b', 'b'), task('c', 'x {a}')) if stream_plan else \
        plan(task('a', 'a'), task('b', 'b'), task('c', 'x {a}'))
    llm = ScriptedLLM([first, replan('again'), plan(task('d', 'd')), answer('abcd')])
    run = DAGAgent(llm, [Meter(0.05).fn()], stream_plan=stream_plan).run('Q?')
    back = Run.load(run.save(tmp_path / 'dag.jsonl'))
    assert [p.model_dump() for p in back.plans] == [p.model_dump() for p in run.plans]
    assert [p.version for p in back.plans] == [1, 2]
    starts = [(e.index, e.task, e.group) for e in of(back, 'task_start')]
    assert sorted(starts) == sorted((e.index, e.task, e.group) for e in of(run, 'task_start'))
    assert all(g is not None and g >= 1 for _, _, g in starts)
    assert {t: g for i, t, g in starts if i == 2}['c'] > {t: g for i, t, g in starts if i == 2}['a']
    assert sorted(e.task for e in of(back, 'task_end')) == ['a', 'b', 'c', 'd']
    assert [s.index for s in back.steps] == [s.index for s in run.steps] == [1, 2, 3, 4, 5, 6]
    assert (back.answer, back.stop_reason, back.meta['architecture']) == ('abcd', 'answer', 'dag')


# --- the streamed plan ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize('stream_plan', [False, True])
def test_a_streamed_plan_starts_tasks_before_the_planner_has_finished(stream_plan):
    llm = LatencyLLM(ScriptedLLM([lines(task('a', 'a'), task('b', 'b'), task('c', 'c')) if stream_plan
                                  else plan(task('a', 'a'), task('b', 'b'), task('c', 'c')), answer('abc')]),
                     per_call=0.05, per_token=0.002)
    evs = list(DAGAgent(llm, [Meter(0.01).fn()], stream_plan=stream_plan).stream('Q?'))
    where = {(e.type, getattr(e, 'task', None) or getattr(getattr(e, 'step', None), 'index', None)): n
             for n, e in enumerate(evs)}
    assert (where[('task_start', 'a')] < where[('step_end', 1)]) == stream_plan
    assert llm.inner.calls[0]['json_mode'] == (not stream_plan)  # a line per task is not one JSON object
    assert Run.from_events(evs).answer == 'abc'


def test_a_streamed_line_that_cannot_run_is_dropped_and_the_rest_runs():
    text = '\n'.join(['```', say({'thought': 't'}), say(task('a', 'a')), say({'id': 'b', 'tool': 'nope', 'args': {}}),
                      say(task('c', 'c', ['b'])), '{"id": "d", "tool": "slow", "args": {"x": "d"', say(task('e', 'e')),
                      'x' * 30_000, '```'])
    run = DAGAgent(ScriptedLLM([text, answer('a and e')]), [Meter(0.01).fn()], stream_plan=True).run('Q?')
    assert [t.id for t in run.plans[0].tasks] == ['a', 'e']
    kinds = [g.kind for g in run.steps[0].safeguards]
    assert kinds == ['validation', 'validation', 'validation', 'size_cap'] and run.stop_reason == 'answer'
    assert sorted(obs(run, 2)) == ['a', 'e']


def test_a_streamed_reply_with_no_task_is_asked_again_as_one_object():
    llm = ScriptedLLM(['Let me think about the orders first.', plan(task('a', 'a')), answer('a')])
    run = DAGAgent(llm, [Meter(0.01).fn()], stream_plan=True).run('Q?')
    assert [s.parse_level for s in run.steps] == ['failed', 'strict', 'native', 'strict']
    assert [c['json_mode'] for c in llm.calls] == [False, True, True]
    assert llm.calls[1]['messages'][-1]['content'].startswith('Your last reply could not be used.')
    assert (run.answer, run.plans[0].index) == ('a', 2)


# --- nothing raises out of a run ------------------------------------------------------------------------------------

def test_model_and_agent_failures_end_the_run_with_a_stop_reason():
    assert DAGAgent(ScriptedLLM([]), [Meter().fn()]).run('Q?').stop_reason == 'llm_error'
    assert DAGAgent(ScriptedLLM([]), [Meter().fn()], stream_plan=True).run('Q?').stop_reason == 'llm_error'
    huge = plan(*[task(f't{i}', 'x') for i in range(25)])
    run = DAGAgent(ScriptedLLM([huge] * 3), [Meter().fn()]).run('Q?')
    assert run.stop_reason == 'parse_failures' and 'keep it to 20 at most' in run.steps[0].safeguards[0].detail

    class Buggy(ToolRegistry):
        def call(self, *args, **kw): raise KeyError('a bug')
    for stream_plan in (False, True):
        first = lines(task('a', 'a')) if stream_plan else plan(task('a', 'a'))
        run = DAGAgent(ScriptedLLM([first]), Buggy([Meter().fn()]), stream_plan=stream_plan).run('Q?')
        assert run.stop_reason == 'error' and [g.kind for g in run.steps[-1].safeguards] == ['internal_error']


# --- the latency wrapper ------------------------------------------------------------------------------------------

def test_latency_llm_waits_per_call_and_per_token_and_keeps_the_labels():
    inner = ScriptedLLM([answer('x'), lines(task('a', 'a'))], name='sim')
    inner.meta = {'simulated': True, 'simulated_note': 'a stand-in'}
    slow = LatencyLLM(inner, per_call=0.2, per_token=0.001)
    t = time.perf_counter()
    r = slow.chat([{'role': 'user', 'content': 'Q?'}])
    took = time.perf_counter() - t
    assert slow.slept == pytest.approx(0.2 + 0.001 * r.completion_tokens) and took >= slow.slept
    pieces = list(slow.stream([{'role': 'user', 'content': 'Q?'}]))
    assert ''.join(pieces[:-1]) == pieces[-1].content == lines(task('a', 'a'))
    assert slow.slept == pytest.approx(0.4 + 0.001 * (r.completion_tokens + pieces[-1].completion_tokens))
    assert (slow.name, slow.meta, slow.usage.llm_calls) == ('sim', inner.meta, 2)
    run = DAGAgent(LatencyLLM(ScriptedLLM([plan(task('a', 'a')), answer('a')]), 0.01), [Meter(0.01).fn()]).run('Q?')
    assert run.meta['architecture'] == 'dag' and run.answer == 'a'
    inner2 = ScriptedLLM([plan(task('a', 'a')), answer('a')])
    inner2.meta = {'simulated': True}
    assert DAGAgent(LatencyLLM(inner2, 0.0, 0.0), [Meter(0.01).fn()]).run('Q?').meta['simulated'] is True


def test_read_dag_refuses_tasks_without_a_tool():
    with pytest.raises(ValueError, match='call no tool'):
        read_dag({'plan': ['just think']}, ToolRegistry([Meter().fn()]))
