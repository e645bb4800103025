"""`reach ask --agent NAME` and `reach bench agents`, run as a user runs them: the console script in a subprocess,
the simulated analyst (`--model sim-analyst`, not a model) playing every role over the risk tools."""
import shutil
import pytest
from reach_nb.core import Run
from reach_nb.risk.data import ensure_dataset, ground_truth
from reach_nb.agents.registry import example_pipeline
from reach_nb.risk.analysis import SPIKE_QUESTION
from reach_cli import run_reach

AGENTS = ['react', 'plan-execute', 'rewoo', 'dag', 'router', 'pipeline']
SHOWN = {'plan-execute': '── plan 1: ', 'rewoo': '── plan 1: ', 'dag': '── plan 1: ',
         'router': '→ routed to plan-execute (by rules)', 'pipeline': '── step 4', 'react': '── step 7'}


@pytest.fixture(scope='module')
def cause():
    "What an answer must name: the spike's channel, item and devices (the dataset's ground truth)."
    spike = next(g for g in ground_truth(ensure_dataset()) if g['pattern'] == 'channel_spike')
    return [spike['channel_id'], *spike['key_entities']['items'], *spike['key_entities']['muids']]


@pytest.mark.parametrize('agent', AGENTS)
def test_each_agent_answers_the_demo_question(tmp_path, cause, agent):
    trace = tmp_path/'run.jsonl'
    r = run_reach('ask', '--agent', agent, '--model', 'sim-analyst', '--trace', str(trace), SPIKE_QUESTION,
               cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert '== stopped: answer' in r.stdout and SHOWN[agent] in r.stdout, r.stdout[-3000:]
    assert all(v in r.stdout for v in cause) and '(simulated: ' in r.stdout
    run = Run.load(trace)
    assert (run.agent, run.stop_reason, run.meta['simulated']) == (agent, 'answer', True)
    assert all(v in run.answer for v in cause) and run.usage.tool_calls == 10


def test_chat_answers_that_it_is_a_data_question(tmp_path):
    r = run_reach('ask', '--agent', 'chat', '--model', 'sim-analyst', SPIKE_QUESTION, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'ask it as a data question' in r.stdout and '0 tool calls' in r.stdout


def test_a_pipeline_file_of_ones_own(tmp_path, cause):
    "`--pipeline` runs the YAML file given: a copy of the example, renamed, with a cap of its own."
    mine = tmp_path/'mine'
    shutil.copytree(example_pipeline().parent, mine)
    yaml = mine/'think_act_observe.yaml'
    yaml.write_text(yaml.read_text().replace('name: think_act_observe', 'name: my_stages')
                    .replace('max_iterations: 5', 'max_iterations: 4'))
    r = run_reach('ask', '--agent', 'pipeline', '--pipeline', str(yaml), '--model', 'sim-analyst',
               '--trace', str(tmp_path/'p.jsonl'), SPIKE_QUESTION, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = Run.load(tmp_path/'p.jsonl')
    assert (run.meta['pipeline'], run.meta['max_iterations']) == ('my_stages', 4)
    assert all(v in run.answer for v in cause)


@pytest.mark.parametrize('args, line', [
    (['--agent', 'swarm'], "Error: unknown agent 'swarm' in option --agent: use one of react, plan-execute, rewoo, "
                           "dag, router, pipeline, chat"),
    (['--pipeline', 'p.yaml'], 'Error: --pipeline without --agent pipeline in option --pipeline: add --agent '
                               'pipeline, or drop it'),
    (['--agent', 'pipeline', '--pipeline', 'nosuch.yaml'], 'Error: no file nosuch.yaml in nosuch.yaml: give the path '
                                                           'of a pipeline YAML file'),
    (['--agent', 'rewoo', '--native'], 'Error: --native with --agent rewoo in option --native: it is for ReAct: '
                                       'drop it'),
    (['--agent', 'dag', '--context', 'window'], 'Error: --context with --agent dag in option --context: it is for '
                                                'ReAct and plan-execute: drop it')])
def test_agent_mistakes_are_one_error_line(tmp_path, args, line):
    r = run_reach('ask', *args, '--model', 'sim-analyst', SPIKE_QUESTION, cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (2, '', line + '\n')


def test_a_broken_pipeline_file_is_one_error_line(tmp_path):
    (tmp_path/'p.yaml').write_text('name: x\nstages:\n  - name: think\n    template: "Plan {next_move}."\n')
    r = run_reach('ask', '--agent', 'pipeline', '--pipeline', str(tmp_path/'p.yaml'), '--model', 'sim-analyst',
               SPIKE_QUESTION, cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == '' and r.stderr.count('\n') == 1, r.stderr
    assert r.stderr.startswith('Error: unknown placeholder {next_move} in ') and 'p.yaml' in r.stderr


def test_bench_agents_prints_the_table_the_targets_and_a_chart(tmp_path):
    chart = tmp_path/'agents.png'
    r = run_reach('bench', 'agents', '--per-call', '0', '--per-token', '0', '--agents', 'react,rewoo,dag',
               '--chart', str(chart), cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    table = r.stdout.split('\n\n')[1].splitlines()
    assert [l.split()[0] for l in table] == ['architecture', 'react', 'rewoo', 'dag']
    assert all(' yes ' in l for l in table[1:]) and table[1].split()[-2:] == ['1.0x', '1.0x']
    assert 'rewoo prompt tokens: ' in r.stdout and 'dag wall time: ' in r.stdout
    assert chart.stat().st_size > 10_000 and f'Chart written to {chart}' in r.stdout


@pytest.mark.parametrize('args, line', [
    (['--agents', 'react,swarm'], "Error: unknown agents 'react,swarm' in option --agents: give some of react, "),
    (['--per-call', '-1'], 'Error: --per-call must be at least 0, got -1.0 in option --per-call: ')])
def test_bench_agents_mistakes_are_one_error_line(tmp_path, args, line):
    r = run_reach('bench', 'agents', *args, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith(line) and r.stderr.count('\n') == 1, r.stderr


def test_the_other_benchmarks_still_run(tmp_path):
    r = run_reach('bench', '--help', cwd=tmp_path)
    assert all(c in r.stdout for c in ('agents', 'context', 'data', 'loop', 'recall')), r.stdout
    r = run_reach('bench', 'loop', '--steps', '2', '--runs', '3', '--rounds', '1', cwd=tmp_path)
    assert r.returncode == 0 and 'overhead' in r.stdout, r.stdout + r.stderr
    r = run_reach('bench', 'context', '--steps', '2', cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.splitlines()[2].split()[0] == 'full', r.stdout + r.stderr
