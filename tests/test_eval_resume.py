"""A killed evaluation goes on where it stopped: an evaluation process is killed (SIGKILL) while one run is under way;
started again, it runs only that run and the ones after it, and keeps the rows and traces of the runs that finished."""
import os, signal, subprocess, sys, textwrap, time
from pathlib import Path

import pytest

from reach_nb.core import Run
from reach_nb.eval import EvalConfig, Results, evaluate, load_tasks, trace_path
from reach_nb.llm.models import register_model
from reach_nb.risk.analyst import SimAnalyst

IDS = ['l3-farm-game-channels', 'l3-spike-why', 'l3-survey-zh', 'l3-refund-abuse']  # the first is not simulated
STALLS = 'l3-survey-zh'  # the run under way when the process is killed

CHILD = textwrap.dedent('''
    import sys, time
    from reach_nb.eval import EvalConfig, evaluate, load_tasks
    from reach_nb.llm.models import register_model
    from reach_nb.risk.analyst import SimAnalyst

    tasks = load_tasks(ids=sys.argv[2].split(','))
    tasks.sort(key=lambda t: sys.argv[2].split(',').index(t.id))
    stall = next(t.question for t in tasks if t.id == sys.argv[3])

    class Stalling(SimAnalyst):
        "The simulated analyst, except that it never answers one question."
        def _complete(self, messages, tools, json_mode, temperature):
            if any(m.get('content') == stall for m in messages): time.sleep(600)
            return super()._complete(messages, tools, json_mode, temperature)

    register_model('stalling', lambda arg, settings=None: Stalling())
    evaluate(tasks, [EvalConfig(name='cfg', model='stalling')], sys.argv[1], concurrency=1, progress=False)
''')


class Counting(SimAnalyst):
    "The simulated analyst, recording each question it is asked."
    asked: list = []
    def _complete(self, messages, tools, json_mode, temperature):
        q = next(m['content'] for m in messages if m['role'] == 'user')
        if q not in Counting.asked: Counting.asked.append(q)
        return super()._complete(messages, tools, json_mode, temperature)

register_model('counting', lambda arg, settings=None: Counting())


def _tasks():
    by_id = {t.id: t for t in load_tasks(ids=IDS)}
    return [by_id[i] for i in IDS]


def test_a_killed_evaluation_resumes_without_redoing_finished_runs(tmp_path):
    tasks = _tasks()
    cfg = EvalConfig(name='cfg', model='counting')
    traces = {t.id: trace_path(tmp_path, cfg, t.id, 0) for t in tasks}
    child = subprocess.Popen([sys.executable, '-c', CHILD, str(tmp_path), ','.join(IDS), STALLS],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not traces[STALLS].exists():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, 'the stalling run never started'
            time.sleep(0.05)
        time.sleep(1.0)  # the finished runs are stored as soon as they end; the stalled one never ends
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    assert child.returncode == -signal.SIGKILL
    finished = {t: traces[t].stat().st_mtime_ns for t in IDS[:2]}
    assert Run.load(traces[STALLS]).status == 'incomplete'  # what the killed run did is readable

    evaluate(tasks, [cfg], tmp_path, concurrency=1, progress=False)

    by_id = {t.id: t for t in tasks}
    assert Counting.asked == [by_id[STALLS].question, by_id['l3-refund-abuse'].question]  # only the unfinished ran
    assert {t: traces[t].stat().st_mtime_ns for t in IDS[:2]} == finished  # their traces were not rewritten
    with Results(tmp_path/'results.duckdb') as res: rows = {r['task_id']: r for r in res.rows()}
    assert sorted(rows) == sorted(IDS)
    assert [rows[t]['model'] for t in IDS] == ['stalling', 'stalling', 'counting', 'counting']
    assert [rows[t]['status'] for t in IDS] == ['not_simulated', 'passed', 'passed', 'passed']
    assert Run.load(traces[STALLS]).stop_reason == 'answer'

    Counting.asked.clear()
    evaluate(tasks, [cfg], tmp_path, concurrency=2, progress=False)  # all done: nothing runs
    assert Counting.asked == []
