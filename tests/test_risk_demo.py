"""The risk demo end to end on the default dataset: the SimAnalyst (a simulated analyst, not a model) drives the
ReAct agent over the nine risk tools, and plays every role of the other architectures (Plan-and-Execute, ReWOO,
the DAG agent, the router, the stage pipeline) on the same question.

The answers are checked against the dataset's ground truth (which no tool can read), every number an answer
quotes must appear in an observation of the same run, the analyst must recover from injected model faults,
and served over real HTTP (the local OpenAI-compatible server, the real `openai` SDK) it must reach the same answer.
"""
import os, re, shutil, subprocess
from pathlib import Path

import duckdb, pytest

from reach_nb.config import load_settings
from reach_nb.core import Run
from reach_nb.llm.models import FaultyLLM, OpenAIChat, get_model
from reach_nb.llm.server import ModelServer
from reach_nb.risk.data import LAST_WEEK, ensure_dataset, ground_truth
from reach_nb.risk.agents import risk_agent, run_risk_demo
from reach_nb.risk.analysis import SPIKE_QUESTION, SURVEY_QUESTION
from reach_nb.risk.analyst import SimAnalyst

NUMBER = re.compile(r'\d[\d,]*(?:\.\d+)?%?')


@pytest.fixture(scope='module')
def db():
    return ensure_dataset()


@pytest.fixture(scope='module')
def truth(db):
    return {g['pattern']: g for g in ground_truth(db)}


@pytest.fixture(scope='module')
def spike_run(db):
    return run_risk_demo(db=db)


def observed(run:Run) -> str:
    "Everything the tools returned during a run."
    return '\n'.join(o.content for s in run.steps for o in s.observations)


def invented(run:Run) -> list[str]:
    "Numbers in the answer that no observation of the run contains."
    seen = observed(run)
    return [n for n in NUMBER.findall(run.answer) if n not in seen]


def game_name(db, game_id:str) -> str:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT game_name FROM games WHERE game_id = ?", [game_id]).fetchone()[0]


def test_spike_demo_names_the_labelled_spike(spike_run, truth):
    spike = truth['channel_spike']
    assert spike_run.stop_reason == 'answer'
    for v in (spike['channel_id'], spike['game_id'], *spike['key_entities']['items'], *spike['key_entities']['muids']):
        assert v in spike_run.answer, v
    assert truth['proxy_recharge']['channel_id'] not in spike_run.answer  # the other ring did not make last week jump
    calls = [[a.tool for a in s.actions] for s in spike_run.steps]
    assert calls == [['list_datasets'], ['describe_dataset', 'search_knowledge', 'list_operators'], ['create_procedure'],
                     ['create_task'], ['run_task'], ['get_result'] * 3, []]  # independent calls share a step


def test_trace_says_simulated(spike_run, tmp_path):
    back = Run.load(spike_run.save(tmp_path/'demo.jsonl'))
    assert back.meta['simulated'] is True and 'not a model' in back.meta['simulated_note']
    assert 'not a model' in back.model and back.answer == spike_run.answer


def test_last_week_is_read_from_the_data(spike_run):
    task = next(s for s in spike_run.steps if s.action and s.action.tool == 'create_task')
    assert (task.action.args['start'], task.action.args['end']) == tuple(str(d) for d in LAST_WEEK)
    assert f'The data ends on {LAST_WEEK[1]}' in task.thought


def test_no_invented_numbers(spike_run):
    assert len(NUMBER.findall(spike_run.answer)) >= 15
    assert invented(spike_run) == []


def test_chinese_question_names_both_rings(db, truth):
    run = run_risk_demo(SURVEY_QUESTION, db=db)
    assert run.stop_reason == 'answer'
    assert re.search(r'[\u4e00-\u9fff]', run.answer) and '代充' in run.answer and '退款' in run.answer
    for p in ('channel_spike', 'proxy_recharge'):
        assert truth[p]['channel_id'] in run.answer and truth[p]['game_id'] in run.answer, p
    assert all(m in run.answer for m in truth['proxy_recharge']['key_entities']['muids'])
    task = next(s for s in run.steps if s.action and s.action.tool == 'create_task').action.args
    assert (task['start'], task['end'], task['baseline_start'], task['baseline_end']) == ('2026-06-01', '2026-06-30', '2026-05-02', '2026-05-31')
    assert invented(run) == []


def test_question_naming_the_spike_game(db, truth):
    gid = truth['channel_spike']['game_id']
    run = run_risk_demo(f'Why did recharge volume of {game_name(db, gid)} jump last week?', db=db)
    assert f'{gid} ({game_name(db, gid)}), the game you asked about, rose' in run.answer
    assert truth['channel_spike']['channel_id'] in run.answer and invented(run) == []


def test_question_naming_another_game(db, truth):
    other = truth['proxy_recharge']['game_id']  # a game whose volume did not jump last week
    run = run_risk_demo(f'Why did {game_name(db, other)} recharge volume rise last week?', db=db)
    assert f'{other} ({game_name(db, other)}), the game you asked about, changed by' in run.answer
    assert truth['channel_spike']['channel_id'] in run.answer and invented(run) == []


def test_refund_question_puts_refunds_first(db, truth):
    run = run_risk_demo('Which accounts abuse refunds in the last month?', db=db)
    lines = run.answer.splitlines()
    assert lines[1].startswith('Refunds: ') and truth['refund_abuse']['game_id'] in lines[1], lines[:2]
    assert invented(run) == []


@pytest.mark.parametrize('seed', [0, 3, 6, 10])
def test_recovers_from_model_faults(db, spike_run, seed):
    llm = FaultyLLM(SimAnalyst(), rate=0.3, seed=seed)
    run = run_risk_demo(llm=llm, db=db)
    kinds = {g.kind for s in run.steps for g in s.safeguards}
    assert llm.injected and kinds & {'correction', 'suggestion'}, (llm.injected, kinds)
    assert run.stop_reason == 'answer' and run.answer == spike_run.answer
    assert len(run.steps) > len(spike_run.steps)


def test_concludes_honestly_when_out_of_steps(db):
    run = run_risk_demo(db=db, max_steps=3)
    assert run.stop_reason == 'max_steps'
    assert run.answer.startswith('I could not complete the analysis: the step limit was reached.')
    assert 'I could not find the total change' in run.answer and invented(run) == []


def test_served_over_http_reaches_the_same_answer(db, spike_run):
    with ModelServer(SimAnalyst()) as srv:
        llm = OpenAIChat('sim-analyst', base_url=srv.base_url, timeout=30, max_retries=0)
        run = run_risk_demo(llm=llm, db=db)
        sent = srv.app.state.requests
    assert run.stop_reason == 'answer' and run.answer == spike_run.answer
    assert [s.action and str(s.action) for s in run.steps] == [s.action and str(s.action) for s in spike_run.steps]
    assert len(sent) == len(spike_run.steps) and all(r['response_format'] == {'type': 'json_object'} for r in sent)
    assert llm.usage.llm_calls == len(spike_run.steps)


def test_registered_by_name():
    m = get_model('sim-analyst')
    assert isinstance(m, SimAnalyst) and m.meta['simulated'] is True


def test_reach_ask_sim_analyst_answers_within_the_default_step_limit(db, truth):
    "`reach ask --model sim-analyst` with the project's settings.ini (max_steps = 10) answers and names the planted cause."
    root = Path(__file__).resolve().parents[1]
    assert load_settings(root/'settings.ini', env={}).max_steps == 10  # the default limit this test is about
    reach = shutil.which('reach') or pytest.fail('the `reach` console script is not installed: pip install -e .')
    env = {k: v for k, v in os.environ.items() if not (k.startswith('REACH_') or k.startswith('OPENAI_'))}
    r = subprocess.run([reach, 'ask', '--model', 'sim-analyst', SPIKE_QUESTION], cwd=root, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.search(r'\bstopped: answer\b', r.stdout), r.stdout[-3000:]  # the stop reason, as printed
    spike, muids = truth['channel_spike'], truth['channel_spike']['key_entities']['muids']
    assert f"{len(muids)} devices paid through {spike['channel_id']} for many accounts each" in r.stdout  # said by the answer only
    assert f"suspend {spike['channel_id']} for {spike['key_entities']['items'][0]}" in r.stdout
    assert all(m in r.stdout for m in muids) and len(muids) == 3


# -- every architecture, the simulated analyst playing each of its roles -------------------------------------------
ARCHITECTURES = ['plan-execute', 'rewoo', 'dag', 'router', 'pipeline']
ZH_SPIKE = '上周充值量为什么上涨？'


@pytest.fixture(scope='module')
def arch_runs(db):
    return {a: run_risk_demo(db=db, agent=a) for a in ARCHITECTURES}


def names_the_spike(answer:str, truth:dict) -> bool:
    spike = truth['channel_spike']
    return all(v in answer for v in (spike['channel_id'], *spike['key_entities']['items'],
                                     *spike['key_entities']['muids']))


@pytest.mark.parametrize('agent', ARCHITECTURES)
def test_each_architecture_names_the_planted_cause(arch_runs, truth, agent):
    run = arch_runs[agent]
    assert run.stop_reason == 'answer' and run.meta['simulated'] is True, (run.stop_reason, run.answer)
    assert names_the_spike(run.answer, truth), run.answer
    assert truth['proxy_recharge']['channel_id'] not in run.answer  # the other ring did not make last week jump
    assert invented(run) == [] and len(NUMBER.findall(run.answer)) >= 15
    assert run.usage.tool_calls == 10  # the same ten calls as ReAct's, none repeated


@pytest.mark.parametrize('agent', ARCHITECTURES)
def test_each_architecture_answers_the_chinese_question(db, truth, agent):
    run = run_risk_demo(ZH_SPIKE, db=db, agent=agent)
    assert run.stop_reason == 'answer' and names_the_spike(run.answer, truth), run.answer
    assert re.search(r'[\u4e00-\u9fff]', run.answer) and '代充' in run.answer and invented(run) == []


def test_rewoo_plans_once_without_observations_and_passes_ids_on(arch_runs):
    run = arch_runs['rewoo']
    assert run.usage.llm_calls == 2 and len(run.plans) == 1
    tasks = {t.call.tool: t for t in run.plans[0].tasks}
    assert tasks['create_task'].call.args['procedure_id'] == '#E2' and tasks['create_task'].deps == ['E2']
    assert tasks['run_task'].deps == [tasks['create_task'].id]
    assert 'Created procedure' not in str(run.steps[0].prompt)  # the planner saw no result
    assert [o.ok for o in run.steps[1].observations] == [True] * 10


def test_dag_runs_independent_calls_together_and_the_chain_in_order(arch_runs):
    run = arch_runs['dag']
    assert run.usage.llm_calls == 2 and [p.version for p in run.plans] == [1]
    group = {e.task: e.group for e in run.extra if e.type == 'task_start'}
    tool = {t.id: t.call.tool for t in run.plans[0].tasks}
    first = [t for t, g in group.items() if g == 1]
    assert len(first) >= 2 and {tool[t] for t in first} <= {'list_datasets', 'create_procedure', 'search_knowledge',
                                                            'describe_dataset', 'list_operators'}
    by_tool = {tool[t]: g for t, g in group.items()}
    assert by_tool['create_procedure'] < by_tool['create_task'] < by_tool['run_task'] < by_tool['get_result']


def test_dag_not_told_the_dates_plans_twice(db, truth):
    "Without the data's dates the DAG planner cannot write the task; the join asks for a second plan, which can."
    with risk_agent(db=db, agent='dag') as agent:
        agent.background = ''
        run = agent.run(SPIKE_QUESTION)
    assert run.stop_reason == 'answer' and names_the_spike(run.answer, truth)
    assert [p.version for p in run.plans] == [1, 2] and run.usage.llm_calls == 4
    assert 'create_task' not in {t.call.tool for t in run.plans[0].tasks}


def test_plan_execute_hands_the_task_to_a_helper(arch_runs):
    run = arch_runs['plan-execute']
    goal = next(t for t in run.plans[0].tasks if t.call is None)
    helper = [s for s in run.steps if s.task == goal.id and s.usage.llm_calls]
    assert [a.tool for s in helper for a in s.actions] == ['create_task']
    assert 'Created procedure proc_0001' in helper[0].prompt[0]['content']  # the results so far, in its background
    assert run.usage.llm_calls == 13  # planner, a replanner call after each of the ten steps, the helper's two


def test_router_sends_the_investigation_to_plan_execute(arch_runs):
    run = arch_runs['router']
    assert run.extra[0].type == 'route' and run.extra[0].agent == 'plan-execute' and run.extra[0].by == 'rules'
    assert run.answer == arch_runs['plan-execute'].answer


def test_router_asking_the_model_routes_too(db, truth):
    from reach_nb.agents.router import RouterAgent
    with risk_agent(db=db, agent='router') as agent:
        run = RouterAgent(agent.agents, llm=agent.llm, ask_model='always').run(SPIKE_QUESTION)
    assert run.extra[0].by == 'model' and run.extra[0].agent == 'plan-execute' and names_the_spike(run.answer, truth)


def test_pipeline_stages_share_the_work(arch_runs):
    from reach_nb.agents.pipeline import channels
    run = arch_runs['pipeline']
    assert [s.task for s in run.steps if s.usage.llm_calls] == ['think', 'act', 'observe'] * 4
    ch = channels(run)
    assert ch['user'][-1] == run.answer and ch['error'] == []
    assert [len(s.actions) for s in run.steps if s.task == 'act' and s.actions] == [5, 1, 1, 3]


@pytest.mark.parametrize('agent', ['react'] + ARCHITECTURES + ['chat'])
def test_a_question_it_cannot_simulate_is_not_answered(db, agent):
    run = run_risk_demo('What is the weather in Paris tomorrow?', db=db, agent=agent)
    said = run.answer + ' '.join(s.raw or '' for s in run.steps)
    assert 'cannot simulate' in said and 'A language model is needed' in said, (run.stop_reason, said[:500])
    assert run.usage.tool_calls == 0  # it did not answer another question instead


def test_rewoo_over_http_reads_the_text_plan(db, truth):
    "The ReWOO planner's text plan (not JSON) travels over the local server and the real `openai` client."
    with ModelServer(SimAnalyst()) as srv:
        llm = OpenAIChat('sim-analyst', base_url=srv.base_url, timeout=30, max_retries=0)
        run = run_risk_demo(llm=llm, db=db, agent='rewoo')
        sent = srv.app.state.requests
    assert run.stop_reason == 'answer' and names_the_spike(run.answer, truth) and len(sent) == 2
    assert run.steps[0].raw.splitlines()[1].startswith('Plan: ')
