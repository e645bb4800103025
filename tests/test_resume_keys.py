"""A tool that takes an idempotency key, killed in the middle of its call after its effect: the resumed run calls it
again with the key it had the first time, so the tool does nothing twice and the run ends as it would have.

The child records a run of a small ReAct agent whose `block(device)` tool writes `device key` to a ledger unless
the key is in it already, then (for device `m2` in the first process) says so and sleeps until it is SIGKILLed.
"""
import json, os, select, signal, subprocess, sys
from pathlib import Path

from reach_nb.memory.sessions import SQLiteSessionStore, resume

ROOT = Path(__file__).resolve().parent.parent

AGENT = r'''
import json, os, sys, time
from reach_nb.llm.models import FunctionLLM
from reach_nb.agents.react import ReActAgent
from reach_nb.memory.sessions import SQLiteSessionStore, record
from reach_nb.tools import ToolRegistry

def make_agent(ledger, die_in=''):
    def block(device:str, idempotency_key:str=''): # the device to block
        "Block a device from paying."
        done = open(ledger).read().split() if os.path.exists(ledger) else []
        if idempotency_key not in done:
            with open(ledger, 'a') as f: f.write(f'{device} {idempotency_key}\n')
        if device == die_in: print('KILL-POINT', flush=True); time.sleep(300)
        return f'blocked {device}'
    def model(messages, **kw):
        k = sum(m['role'] == 'assistant' for m in messages)
        if k < 3: return json.dumps({'thought': f'Block m{k + 1}.', 'action': {'tool': 'block', 'args': {'device': f'm{k + 1}'}}})
        return json.dumps({'thought': 'Done.', 'answer': 'Blocked m1, m2 and m3.'})
    return ReActAgent(FunctionLLM(model, name='blocker'), ToolRegistry([block]))

if __name__ == '__main__':
    where, ledger = sys.argv[1:]
    with SQLiteSessionStore(where) as store: record(store, make_agent(ledger, die_in='m2'), 'Block m1, m2, m3.', 's')
'''


def test_a_keyed_call_killed_after_its_effect_is_not_done_twice(tmp_path):
    path = tmp_path/'blocker.py'
    path.write_text(AGENT)
    where, ledger = tmp_path/'s.sqlite', tmp_path/'ledger'
    p = subprocess.Popen([sys.executable, str(path), str(where), str(ledger)], cwd=ROOT, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ | {'PYTHONPATH': str(ROOT)})
    try:
        ready, _, _ = select.select([p.stdout], [], [], 120)
        line = p.stdout.readline() if ready else ''
        assert line.startswith('KILL-POINT'), (line, p.stderr.read()[-3000:])
    finally:
        p.send_signal(signal.SIGKILL); p.wait(30)
    first = ledger.read_text().split('\n')[:2]
    assert [l.split()[0] for l in first] == ['m1', 'm2']  # m2's effect happened; its call never returned
    sys.path.insert(0, str(tmp_path))
    try:
        import blocker
        with SQLiteSessionStore(where) as store:
            run_id = store.runs('s')[0].run_id
            assert store.info(run_id).status == 'incomplete'
            run = resume(store, run_id, blocker.make_agent(str(ledger)))
    finally: sys.path.remove(str(tmp_path))
    rows = [l.split() for l in ledger.read_text().splitlines()]
    assert [d for d, _ in rows] == ['m1', 'm2', 'm3']  # m2 was called again with its key, and did nothing twice
    assert len({k for _, k in rows}) == 3 and all(len(k) == 32 for _, k in rows)
    assert (run.stop_reason, run.answer) == ('answer', 'Blocked m1, m2 and m3.')
    assert [o.content for s in run.steps for o in s.observations] == ['blocked m1', 'blocked m2', 'blocked m3']
