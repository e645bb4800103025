"""`reach ask --session` killed for real after the run made a task, then `reach resume`: the task is still there,
because the risk tools' workspace store (procedures, tasks, results) is kept with the session, not in a temporary
folder that dies with the process. Every architecture that uses tools is resumed so: `reach resume` makes the agent
the run was made with again from what the run stored. The model is the offline analyst behind `reach serve-model`,
slowed so the kill lands between two model calls."""
import os, re, signal, subprocess

import pytest

from reach_cli import REACH, clean_env, run_reach, served

QUESTION = 'Why did recharge volume jump last week?'


def _ask_until_task_made(base:str, cwd, env, agent:str='react') -> str:
    "Start `reach ask --session`, SIGKILL it once create_task has answered; the run's id."
    p = subprocess.Popen([REACH, 'ask', '--session', 'analyst-1', '--agent', agent, '--model', 'openai:sim-analyst',
                          '--base-url', base, QUESTION], cwd=cwd, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    run_id, seen = None, []
    try:
        for line in p.stdout:
            seen.append(line)
            if m := re.search(r'Run: (\S+)', line): run_id = m[1]
            if run_id and 'task_0001' in line and 'create_task' not in line: break
        else: raise AssertionError('the run ended before it made a task:\n' + ''.join(seen))
    finally:
        p.send_signal(signal.SIGKILL); p.wait(30)
    assert p.returncode == -signal.SIGKILL
    return run_id


@pytest.mark.parametrize('agent', ['react', 'plan-execute', 'rewoo', 'dag', 'router', 'pipeline'])
def test_a_resumed_session_run_finds_the_tasks_it_made(agent, tmp_path):
    env = clean_env(REACH_TRACE_DIR=str(tmp_path/'traces'))
    with served('sim-analyst', '--latency', '1.0') as base:
        run_id = _ask_until_task_made(base, tmp_path, env, agent)
        assert list((tmp_path/'traces'/'workspaces').glob('*.sqlite')), 'no workspace store kept for the session'
        r = run_reach('resume', run_id, cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "no task 'task_0001'" not in r.stdout and 'could not complete' not in r.stdout
    answer = r.stdout.split('answer  :')[-1]
    assert 'c09' in answer and '%' in answer, answer[:1000]
