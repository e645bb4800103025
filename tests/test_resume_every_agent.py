"""Every architecture, SIGKILLed at step boundaries, inside a tool call, inside parallel calls and during the final
answer, then resumed: the answer equals the uninterrupted run's, and every tool call ran exactly once in all.

One exception is counted, not hidden: when the process dies while calls run side by side (a ReAct step's calls,
the planners' work steps), a call that finished in the moment before its result was stored runs again. No call
whose result was stored ever runs again; an architecture that runs one call at a time loses nothing.

A child process records a run of the risk agent (the offline analyst over the nine risk tools and the sample data)
into a session store, with the tools' workspace in a file beside it. Every tool call that runs to its end appends a
line to a ledger. The child stops for good at a chosen point and the parent SIGKILLs it: right after the `n`-th
stored event of a type, or inside the `n`-th tool call (the call has started and is sleeping; calls running beside
it go on). The parent then resumes the run in process with `reach_nb.memory.sessions.resume`.
"""
import json, os, select, signal, subprocess, sys
from collections import Counter
from pathlib import Path

import pytest

from reach_nb.risk.data import ensure_dataset
from reach_nb.memory.sessions import SQLiteSessionStore, record, resume
from reach_nb.agents.registry import AGENTS

ROOT = Path(__file__).resolve().parent.parent

CHILD = r'''
import json, sys, threading, time
from reach_nb.agents.kernel import rewired, watched
from reach_nb.memory.sessions import SQLiteSessionStore, record, resume
from reach_nb.risk.agents import risk_agent
from reach_nb.risk.analysis import SPIKE_QUESTION
from kill_points import stop_at

def ledgered(agent, ledger, stop_in_call=0):
    "`agent` whose tool calls each append a line to `ledger` when they end; the `stop_in_call`-th call never ends."
    n, lock = [0], threading.Lock()
    def before(c):
        with lock: n[0] += 1; k = n[0]
        if k == stop_in_call: print('KILL-POINT in-call', flush=True); time.sleep(300)
    def after(c, o):
        with lock, open(ledger, 'a') as f: f.write(json.dumps([c.tool, c.args], sort_keys=True) + '\n')
        return o
    return rewired(agent, tools=lambda reg: watched(reg, before, after))

if __name__ == '__main__':
    db, where, ws, ledger, arch, kind, nth = sys.argv[1:]
    store = SQLiteSessionStore(where)
    new_run = store.new_run
    def announced(*a, **kw):
        rid = new_run(*a, **kw); print('RUN', rid, flush=True); return rid
    store.new_run = announced
    if kind != 'in-call': stop_at(store, kind, int(nth))
    with risk_agent(db=db, agent=arch, store=ws) as agent:
        run = record(store, ledgered(agent, ledger, int(nth) if kind == 'in-call' else 0), SPIKE_QUESTION, 's')
    print('FINISHED', json.dumps(run.answer), flush=True)
'''


@pytest.fixture(scope='module')
def child(tmp_path_factory):
    path = tmp_path_factory.mktemp('child')/'risk_child.py'
    path.write_text(CHILD)
    sys.path.insert(0, str(path.parent))
    import risk_child
    yield risk_child, path
    sys.path.remove(str(path.parent))


@pytest.fixture(scope='module')
def db(): return ensure_dataset()


def ledger_of(p:Path) -> Counter: return Counter(p.read_text().splitlines() if p.exists() else [])


@pytest.fixture(scope='module')
def baselines(child, db, tmp_path_factory):
    "Each architecture's uninterrupted run, recorded in process: its answer, its ledger, its events by type."
    mod, _ = child
    d, out = tmp_path_factory.mktemp('baseline'), {}
    for arch in AGENTS:
        with SQLiteSessionStore(d/f'{arch}.sqlite') as store, \
             mod.risk_agent(db=db, agent=arch, store=d/f'{arch}.ws') as agent:
            run = record(store, mod.ledgered(agent, d/f'{arch}.ledger'), mod.SPIKE_QUESTION, 's')
            kinds = Counter(e.type for e in store.events(run.meta['run_id']))
        assert run.stop_reason == 'answer', (arch, run.stop_reason)
        out[arch] = dict(answer=run.answer, ledger=ledger_of(d/f'{arch}.ledger'), kinds=kinds)
    return out


def read_line(p:subprocess.Popen, timeout:float=120) -> str:
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    return p.stdout.readline() if ready else ''


def kill_child(path:Path, db, d:Path, arch:str, kind:str, nth:int) -> str:
    "Run the child until it stops at the point, SIGKILL it; the id of its run."
    cmd = [sys.executable, str(path), str(db), str(d/'s.sqlite'), str(d/'ws.sqlite'), str(d/'ledger'), arch, kind,
           str(nth)]
    p = subprocess.Popen(cmd, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=os.environ | {'PYTHONPATH': f"{ROOT}{os.pathsep}{ROOT/'tests'}"})
    try:
        first, line = read_line(p), read_line(p)
        assert first.startswith('RUN ') and line.startswith('KILL-POINT'), \
            f'{arch}: no stop at {kind}#{nth}: {first!r} {line!r} {p.stderr.read()[-3000:]}'
        run_id = first.split()[1]
    finally:
        p.send_signal(signal.SIGKILL); p.wait(30)
    assert p.returncode == -signal.SIGKILL
    return run_id


# (event type, which one): 'first', 'second', 'third' or 'last' of that type in the uninterrupted run
POINTS = [('step_end', 'first'), ('step_end', 'second'), ('tool_start', 'second'), ('tool_end', 'third'),
          ('in-call', 'first'), ('in-call', 'third'), ('model_output', 'last'), ('step_end', 'last')]


@pytest.mark.parametrize('arch', AGENTS)
@pytest.mark.parametrize('kind,which', POINTS, ids=[f'{k}-{w}' for k, w in POINTS])
def test_killed_and_resumed(arch, kind, which, child, db, baselines, tmp_path):
    mod, path = child
    base = baselines[arch]
    have = sum(base['ledger'].values()) if kind == 'in-call' else base['kinds'][kind]
    nth = {'first': 1, 'second': 2, 'third': 3, 'last': have}[which]
    if have < nth or have == 0: pytest.skip(f"the {arch} run has {have} {kind} point(s)")
    run_id = kill_child(path, db, tmp_path, arch, kind, nth)
    before = ledger_of(tmp_path/'ledger')
    with SQLiteSessionStore(tmp_path/'s.sqlite') as store:
        assert store.info(run_id).status == 'incomplete'
        kept = Counter(json.dumps([e.call.tool, e.call.args], sort_keys=True)
                       for e in store.events(run_id) if e.type == 'tool_end' and e.call)
        with mod.risk_agent(db=db, agent=arch, store=tmp_path/'ws.sqlite') as agent:
            run = resume(store, run_id, mod.ledgered(agent, tmp_path/'ledger'))
        stored = store.run(run_id)
    assert (run.stop_reason, run.answer) == ('answer', base['answer'])
    assert stored.status == 'finished' and stored.answer == base['answer']
    after, lost = ledger_of(tmp_path/'ledger'), before - kept  # lost: ran, but the kill came before it was stored
    assert not kept - before, 'a stored result that no call made'
    assert after - lost == base['ledger'], 'a call whose result was stored ran again, or a call never ran'
    if arch == 'plan-execute':  # it runs one call at a time: none can be in flight, unstored, at the kill
        assert (lost, after) == (Counter(), base['ledger'])
    if kind == 'in-call': assert sum(before.values()) < sum(base['ledger'].values())
