"""An evaluation that cannot be fooled: over all the shipped tasks and a real (small) dataset, a model that calls no
tool and repeats the question, or one that refuses, passes no task; runs the simulated analyst declines are counted
apart, not as failures of format or self-correction."""
import json, zlib

import pytest

from reach_nb.eval import EvalConfig, eval_cli, evaluate, load_tasks, metrics, rows_of, summary
from reach_nb.llm.models import FunctionLLM, register_model
from reach_nb.risk.data import build_dataset

REFUSALS = ["I don't know.", 'Sorry, I could not run the tools.', 'No answer.', '无法模拟', '我不知道。']


def _refuse(messages, **kw):
    "A model that calls no tool and refuses, in a way chosen by the question."
    q = next(m['content'] for m in messages if m['role'] == 'user')
    said = REFUSALS[zlib.crc32(q.encode()) % len(REFUSALS)]
    return json.dumps({'thought': 'I will not look.', 'answer': said}, ensure_ascii=False)

register_model('refusing', lambda arg, settings=None: FunctionLLM(_refuse, name='refusing'))


@pytest.fixture(scope='module')
def small_db(tmp_path_factory):
    "A 100,000-row copy of the sample data (every pattern planted)."
    return build_dataset(tmp_path_factory.mktemp('data')/'risk.duckdb', rows=100_000)


@pytest.mark.parametrize('model', ['echo', 'refusing'])
def test_a_model_that_does_nothing_passes_no_task(tmp_path, small_db, model):
    tasks, cfg = load_tasks(), EvalConfig(model=model)
    assert len(tasks) == 56
    rows = rows_of(evaluate(tasks, [cfg], tmp_path, concurrency=2, db=small_db, progress=False), tasks, [cfg], [0])
    assert len(rows) == 56 and all(r['stop_reason'] == 'answer' and r['tool_calls'] == 0 for r in rows)
    if model == 'echo':
        by_id = {t.id: t.question for t in tasks}
        assert all(r['answer'] == by_id[r['task_id']] for r in rows)  # the question repeated, nothing else
    assert [r['task_id'] for r in rows if r['passed']] == []
    assert {r['status'] for r in rows} == {'failed'}


def test_declined_runs_are_counted_apart(tmp_path, small_db):
    lines = []
    assert eval_cli(agents=('react', 'rewoo', 'dag'), levels=[1], out=tmp_path, db=small_db, progress=False,
                    latency=False, echo=lines.append, concurrency=2) == 0
    table = lines[1].splitlines()
    assert table[0].split()[6] == 'declined'  # configuration level runs completion (95% CI) declined
    rows = {s['config']: s for s in summary(rows_of(tmp_path/'results.duckdb', load_tasks(levels=[1]),
                                                    [EvalConfig(agent=a) for a in ('react', 'rewoo', 'dag')], [0]),
                                            by=('config',))}
    for planner in ('rewoo · sim-analyst', 'dag · sim-analyst'):
        s = rows[planner]
        assert (s['runs'], s['declined'], s['completion']['k']) == (19, 19, 0)
        assert s['first_try']['n'] == 0 and s['self_correction']['n'] == 0 and s['safeguards'] == {}
        line = next(l for l in table if l.startswith(planner) and ' all ' in l)
        assert line.split()[7:11] == ['19', '-', '-', '-'], line  # declined, step eff., format, self-correction
    react = rows['react · sim-analyst']
    assert react['declined'] == 0 and react['first_try']['p'] == 1.0
