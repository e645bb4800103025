"""A recorded run SIGKILLed at chosen events and resumed: same answer, every tool call executed exactly once.

The agent lives in a small module this test writes (`resume_agent.py`): a side-effecting tool `note(x)` that appends
`x` to a ledger file per execution, and a `FunctionLLM` whose reply depends only on the messages it is sent (the
number of assistant messages picks the next scripted reply; the answer lists the results seen), so a model in
another process answers the same. A child process records a run of that agent into a store the test names; its
store stops at the chosen event (the `n`-th stored event of a type), prints `KILL-POINT <run id>` and sleeps, and
the parent SIGKILLs it. The parent then resumes the run with `reach_nb.memory.sessions.resume` and checks the answer,
the ledger (one line per distinct call over both processes), the model calls paid for, and the stored run.
"""
import importlib.util, json, os, select, signal, subprocess, sys, uuid
from pathlib import Path

import pytest

from reach_nb.memory.sessions import RedisSessionStore, SQLiteSessionStore, fork, fork_run, record, resume, resume_session

from redis_server import redis_server

ROOT = Path(__file__).resolve().parent.parent
QUESTION = 'Note a, then b and c together, then d; what was noted?'

AGENT = r'''
import json, re, sys, time
from reach_nb.core import ToolCall
from reach_nb.llm.models import FunctionLLM, LLMResponse
from reach_nb.agents.react import ReActAgent
from reach_nb.memory.sessions import RedisSessionStore, SQLiteSessionStore, record, resume
from reach_nb.tools import ToolRegistry, tool
from kill_points import stop_at

PLAN = [['a'], ['b', 'c'], ['d']]  # the calls of steps 1-3; step 4 answers

def answer_from(messages) -> str:
    "The answer: every result the tools gave, in the order the messages show them."
    seen = [w for m in messages if m['role'] in ('user', 'tool') for w in re.findall(r'noted (\w+)', str(m['content']))]
    return 'Noted: ' + ', '.join(seen) + '.'

def make_agent(ledger, calls, mode='json'):
    "The agent: `note` appends to `ledger` per execution; the model appends to `calls` per call."
    side_effects = mode.endswith('+side-effects')  # note declared as a tool that must never run twice
    mode = mode.removesuffix('+side-effects')
    def note(x:str): # what to note
        "Note x down."
        with open(ledger, 'a') as f: f.write(x + '\n')
        return f'noted {x}'
    def model(messages, **kw):
        with open(calls, 'a') as f: f.write('call\n')
        k = sum(m['role'] == 'assistant' for m in messages)
        if k >= len(PLAN): return json.dumps({'thought': 'Done.', 'answer': answer_from(messages)})
        if mode == 'native':
            return LLMResponse(tool_calls=[ToolCall(tool='note', args={'x': x}, id=f'c{k}{x}') for x in PLAN[k]])
        actions = [{'tool': 'note', 'args': {'x': x}} for x in PLAN[k]]
        return json.dumps({'thought': f'Step {k + 1}.', 'actions': actions})
    # one call at a time, so a kill between the two results of step 2 finds the second call not yet run
    tools = ToolRegistry([tool(note, side_effects=True) if side_effects else note], max_parallel=1)
    return ReActAgent(FunctionLLM(model, name='resume-script'), tools, mode=mode)

def open_where(where:str):
    if where.startswith('redis://'):
        url, prefix = where.split('#')
        return RedisSessionStore(url, prefix=prefix)
    return SQLiteSessionStore(where)

if __name__ == '__main__':
    where, ledger, calls, kind, nth, mode, *run_id = sys.argv[1:]
    store = open_where(where)
    stop_at(store, kind, int(nth))
    agent = make_agent(ledger, calls, mode)
    run = resume(store, run_id[0], agent) if run_id else record(store, agent, QUESTION, 'alice')
    print('FINISHED', json.dumps(run.answer), flush=True)
'''.replace('QUESTION', repr(QUESTION))


@pytest.fixture(scope='module')
def agent_module(tmp_path_factory):
    "The agent module, written to a folder and imported here as the child imports it."
    path = tmp_path_factory.mktemp('agent')/'resume_agent.py'
    path.write_text(AGENT)
    spec = importlib.util.spec_from_file_location('resume_agent', path)
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    mod.path = path
    return mod


def lines(p:Path) -> list[str]: return p.read_text().splitlines() if p.exists() else []


def steps_of(run) -> list:
    return [(s.index, [str(a) for a in s.actions], [o.content for o in s.observations], s.answer) for s in run.steps]


@pytest.fixture(scope='module')
def baseline(agent_module, tmp_path_factory):
    "The uninterrupted run, in process: its answer, steps, ledger and model calls."
    d = tmp_path_factory.mktemp('baseline')
    out = {}
    for mode in ('json', 'native'):
        with SQLiteSessionStore(d/f'{mode}.sqlite') as store:
            run = record(store, agent_module.make_agent(d/f'{mode}.ledger', d/f'{mode}.calls', mode), QUESTION, 'alice')
        out[mode] = dict(answer=run.answer, steps=steps_of(run), ledger=lines(d/f'{mode}.ledger'),
                         calls=len(lines(d/f'{mode}.calls')))
    assert out['json']['answer'] == 'Noted: a, b, c, d.' and out['json']['ledger'] == ['a', 'b', 'c', 'd']
    assert out['json']['calls'] == 4 and out['native']['answer'] == 'Noted: a, b, c, d.'
    return out


def read_line(p:subprocess.Popen, timeout:float=120) -> str:
    "The child's next stdout line, waiting at most `timeout` seconds."
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    return p.stdout.readline() if ready else ''


def kill_child(agent_module, where:str, d:Path, kind:str, nth:int, mode:str='json', run_id:str|None=None) -> str:
    "Start the child (a new run, or resuming `run_id`), SIGKILL it at the `nth` stored `kind` event; its run id."
    cmd = [sys.executable, str(agent_module.path), where, str(d/'ledger'), str(d/'calls'), kind, str(nth), mode]
    p = subprocess.Popen(cmd + ([run_id] if run_id else []), cwd=ROOT, text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=os.environ | {'PYTHONPATH': f"{ROOT}{os.pathsep}{ROOT/'tests'}"})
    try:
        line = read_line(p)
        assert line.startswith('KILL-POINT '), f'child did not stop at {kind}#{nth}: {line!r} {p.stderr.read()[-3000:]}'
    finally:
        p.send_signal(signal.SIGKILL); p.wait(30)
    assert p.returncode == -signal.SIGKILL
    return line.split()[1]


def check_resumed(store, run_id:str, d:Path, base:dict, calls:int|None=None, agent_module=None, mode='json'):
    "Resume in process and check: same answer and steps, each call run once in all, the stored run complete."
    run = resume(store, run_id, agent_module.make_agent(d/'ledger', d/'calls', mode))
    assert (run.answer, run.stop_reason) == (base['answer'], 'answer')
    assert sorted(lines(d/'ledger')) == ['a', 'b', 'c', 'd'], lines(d/'ledger')  # each call executed exactly once
    assert steps_of(run) == base['steps']
    assert len(lines(d/'calls')) == (base['calls'] if calls is None else calls)
    info = store.info(run_id)
    assert (info.status, info.session_id) == ('finished', 'alice')
    again = store.run(run_id)
    assert again.status == 'finished' and again.answer == base['answer'] and steps_of(again) == base['steps']
    assert [e.type for e in store.events(run_id)].count('run_start') == 1
    return run


# (the event type, which one of that type): the child is killed right after that event is stored
KILL_POINTS = {
    'after the run began': ('run_start', 1),
    'after a step_start, before its model call': ('step_start', 2),
    'after model_output, before its tools run': ('model_output', 2),
    'after a tool_start, before its tool runs': ('tool_start', 2),
    'after the first of two tool_ends': ('tool_end', 2),
    'between steps': ('step_end', 2),
    'after the last step, before run_end': ('step_end', 4),
}


@pytest.mark.parametrize('point', KILL_POINTS)
def test_sqlite_kill_and_resume(point, agent_module, baseline, tmp_path):
    kind, nth = KILL_POINTS[point]
    where = str(tmp_path/'sessions.sqlite')
    run_id = kill_child(agent_module, where, tmp_path, kind, nth)
    before = lines(tmp_path/'ledger')
    with SQLiteSessionStore(where) as store:
        assert store.info(run_id).status == 'incomplete' and store.events(run_id)[-1].type == kind
        check_resumed(store, run_id, tmp_path, baseline['json'], agent_module=agent_module)
    if point == 'after the first of two tool_ends':
        assert before == ['a', 'b']  # the second call of step 2 had not run; b was not run again
    if point == 'after model_output, before its tools run': assert before == ['a']


def test_a_side_effect_that_started_is_not_run_again(agent_module, tmp_path):
    "Killed after b's tool_start: b may have taken effect, so the resume tells the model so instead of running it."
    where, mode = str(tmp_path/'sessions.sqlite'), 'json+side-effects'
    run_id = kill_child(agent_module, where, tmp_path, 'tool_start', 2, mode=mode)
    with SQLiteSessionStore(where) as store:
        run = resume(store, run_id, agent_module.make_agent(tmp_path/'ledger', tmp_path/'calls', mode))
        stored = store.run(run_id)
    assert lines(tmp_path/'ledger') == ['a', 'c', 'd']  # b never ran twice (here: its first run was cut off)
    told = stored.steps[1].observations[0]
    assert (told.ok, told.content.split(':')[0], told.args) == (False, 'Not run again', {'x': 'b'})
    assert "note(x='b') had started" in told.content
    assert (run.stop_reason, run.answer, stored.status) == ('answer', 'Noted: a, c, d.', 'finished')


def test_kill_after_first_tool_end_leaves_it_stored_before_the_step_ends(agent_module, tmp_path):
    "The first call's result is stored when that call returns, not when the step ends (else b would run twice)."
    where = str(tmp_path/'sessions.sqlite')
    run_id = kill_child(agent_module, where, tmp_path, 'tool_end', 2)
    with SQLiteSessionStore(where) as store:
        tail = [e.type for e in store.events(run_id)][-4:]
    assert tail == ['model_output', 'tool_start', 'tool_start', 'tool_end'], tail
    assert lines(tmp_path/'ledger') == ['a', 'b']


@pytest.mark.parametrize('nth', [1, 2])
def test_resume_killed_again_then_resumed(nth, agent_module, baseline, tmp_path):
    "A resume killed after it stored its first result (c's) or its second (b's, handed back from the journal) is resumed."
    where = str(tmp_path/'sessions.sqlite')
    run_id = kill_child(agent_module, where, tmp_path, 'tool_end', 2)
    assert kill_child(agent_module, where, tmp_path, 'tool_end', nth, run_id=run_id) == run_id
    assert lines(tmp_path/'ledger') == ['a', 'b', 'c']  # c ran in the resume; b, from the first process, not again
    with SQLiteSessionStore(where) as store:
        assert [e.type for e in store.events(run_id)].count('step_start') == 3  # step 2 was tried twice
        check_resumed(store, run_id, tmp_path, baseline['json'], agent_module=agent_module)


@pytest.mark.parametrize('kind,nth,calls', [('tool_end', 2, 4), ('model_output', 2, 5)])
def test_native_kill_and_resume(kind, nth, calls, agent_module, baseline, tmp_path):
    "Native function calling: the reply is rebuilt from model_output and its tool_starts; without them, asked again."
    where = str(tmp_path/'sessions.sqlite')
    run_id = kill_child(agent_module, where, tmp_path, kind, nth, mode='native')
    with SQLiteSessionStore(where) as store:
        check_resumed(store, run_id, tmp_path, baseline['native'], calls, agent_module=agent_module, mode='native')


@pytest.fixture(scope='module')
def redis_url(tmp_path_factory):
    with redis_server(tmp_path_factory.mktemp('redis')) as server: yield server.url


@pytest.mark.parametrize('kind,nth', [('tool_end', 2), ('step_start', 3)])
def test_redis_kill_and_resume(kind, nth, redis_url, agent_module, baseline, tmp_path):
    prefix = f't{uuid.uuid4().hex[:8]}:'
    run_id = kill_child(agent_module, f'{redis_url}#{prefix}', tmp_path, kind, nth)
    with RedisSessionStore(redis_url, prefix=prefix) as store:
        assert store.info(run_id).status == 'incomplete'
        check_resumed(store, run_id, tmp_path, baseline['json'], agent_module=agent_module)


def test_resume_session_picks_the_cut_run(agent_module, baseline, tmp_path):
    where = str(tmp_path/'sessions.sqlite')
    with SQLiteSessionStore(where) as store:
        done = record(store, agent_module.make_agent(tmp_path/'other', tmp_path/'other.calls'), QUESTION, 'alice')
    run_id = kill_child(agent_module, where, tmp_path, 'model_output', 3)
    with SQLiteSessionStore(where) as store:
        run = resume_session(store, 'alice', agent_module.make_agent(tmp_path/'ledger', tmp_path/'calls'))
        assert run.answer == done.answer == baseline['json']['answer']
        assert [i.status for i in store.runs('alice')] == ['finished', 'finished']
        assert run.meta['run_id'] == run_id and store.run(run_id).meta['session_id'] == 'alice'
        assert sorted(lines(tmp_path/'ledger')) == ['a', 'b', 'c', 'd'] and len(lines(tmp_path/'calls')) == 4
        with pytest.raises(ValueError, match="Error: every run of session 'alice' finished in resume_session"):
            resume_session(store, 'alice', agent_module.make_agent(tmp_path/'ledger', tmp_path/'calls'))
        with pytest.raises(ValueError, match="Error: no session 'nobody' in resume_session"):
            resume_session(store, 'nobody', agent_module.make_agent(tmp_path/'ledger', tmp_path/'calls'))
        finished = resume(store, run_id, agent_module.make_agent(tmp_path/'ledger', tmp_path/'calls'))
        assert finished == store.run(run_id) and len(lines(tmp_path/'calls')) == 4  # a finished run: no model call


def test_fork_replacing_an_observation_and_a_reply(agent_module, tmp_path):
    where = str(tmp_path/'sessions.sqlite')
    ledger, calls = tmp_path/'ledger', tmp_path/'calls'
    with SQLiteSessionStore(where) as store:
        original = record(store, agent_module.make_agent(ledger, calls), QUESTION, 'alice')
        rid = store.runs('alice')[0].run_id
        bodies = store._bodies(rid)
        what_if = fork(store, rid, 2, agent_module.make_agent(ledger, calls), observation=['noted x', 'noted y'])
        b = fork_run(store, rid, 3, agent_module.make_agent(ledger, calls),
                     model_output=json.dumps({'thought': 'Enough.', 'answer': 'Stopped early.'}))
        edited = b.meta['run_id']  # fork gives the id, fork_run the stored Run, which names itself
        assert store._bodies(rid) == bodies  # the original's events are unchanged
        a = store.run(what_if)
        assert b == store.run(edited) and (b.meta['session_id'], b.meta['parent']) == ('alice', rid)
        assert (original.answer, a.answer, b.answer) == ('Noted: a, b, c, d.', 'Noted: a, x, y, d.', 'Stopped early.')
        for fid, k in ((what_if, 2), (edited, 3)):
            info = store.info(fid)
            assert (info.parent, info.fork_step, info.session_id, info.status) == (rid, k, 'alice', 'finished')
        assert (a.meta['parent'], a.meta['fork_step']) == (rid, 2)
        # the reply given stands in for step 3's model call, as in every architecture: counted, with no tokens
        assert [s.index for s in b.steps] == [1, 2, 3] and (b.steps[2].usage.llm_calls, b.steps[2].usage.total_tokens) == (1, 0)
        assert [i.run_id for i in store.runs('alice')] == [rid, what_if, edited]
    assert lines(ledger) == ['a', 'b', 'c', 'd', 'd']  # the observation fork ran only step 3's call again
    assert len(lines(calls)) == 4 + 2  # steps 3 and 4 of the first fork; the second fork's reply was given
    with SQLiteSessionStore(where) as store, pytest.raises(ValueError, match='Error: cannot fork run .* at step 9'):
        fork(store, rid, 9, agent_module.make_agent(ledger, calls))
    with SQLiteSessionStore(where) as store: assert len(store.runs('alice')) == 3  # a bad fork stores nothing
