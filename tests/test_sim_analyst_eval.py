"""The offline SimAnalyst on the evaluation's kinds of question: look-ups of the catalogue, figures over a period,
questions in two parts, in English and Chinese, through the real ReAct agent, tools and DuckDB dataset.

Every figure the analyst answers with must be what the tools returned in that run; the tests check it against an
independent DuckDB query over the same dataset. Questions outside every kind are still declined."""
import re

import duckdb
import pytest

from reach_nb.eval import ABLATIONS, EvalConfig, ablation_name, evaluate, load_tasks, rows_of, said_not_simulated
from reach_nb.risk.data import ensure_dataset, ground_truth
from reach_nb.risk.agents import run_risk_demo
from reach_nb.risk.analysis import SPIKE_QUESTION, read_ask, read_question


@pytest.fixture(scope='module')
def db():
    return ensure_dataset()


@pytest.fixture(scope='module')
def sql(db):
    con = duckdb.connect(str(db), read_only=True)
    yield lambda q: con.execute(q).fetchall()
    con.close()


def observed(run) -> str:
    "Everything the tools returned in the run."
    return '\n'.join(str(o.content) for s in run.steps for o in s.observations)


def tools_of(run) -> list[list[str]]:
    return [[a.tool for a in s.actions] for s in run.steps]


@pytest.mark.parametrize('question, table', [('How many game accounts does the users dataset hold?', 'users'),
                                             ('设备表里记录了多少台设备？', 'devices'),
                                             ('How many different items can be bought across all the games?', 'items')])
def test_catalogue_count(db, sql, question, table):
    run = run_risk_demo(question, db=db)
    n = sql(f'SELECT count(*) FROM {table}')[0][0]
    assert tools_of(run) == [['list_datasets'], []]
    assert f'{n:,}' in run.answer and f'{n:,}' in observed(run), run.answer


def test_catalogue_fields_values_names(db, sql):
    field = run_risk_demo('交易表里记录退款时间的是哪个字段？', db=db)  # not a survey of refund abuse
    assert 'refund_ts' in field.answer and '退款' not in field.answer.split('：')[0], field.answer
    assert tools_of(field) == [['list_datasets', 'describe_dataset'], []]
    status = run_risk_demo('What values can the status of a transaction take?', db=db)
    assert {s for (s,) in sql('SELECT DISTINCT status FROM transactions')} <= set(re.findall(r'\w+', status.answer))
    name = run_risk_demo('渠道 c03 叫什么名字？', db=db)
    assert sql("SELECT channel_name FROM channels WHERE channel_id = 'c03'")[0][0] in name.answer
    first = run_risk_demo('On which day do the transactions begin? Reply with the date only, as YYYY-MM-DD.', db=db)
    assert first.answer == sql("SELECT strftime(min(ts), '%Y-%m-%d') FROM transactions")[0][0]


def test_no_such_dataset_is_said(db):
    run = run_risk_demo('Is there a dataset of chargebacks (disputed payments) to analyse? If there is none, say so.', db=db)
    assert run.answer.startswith('No: there is no dataset of chargebacks'), run.answer
    assert not said_not_simulated(run)


def test_top_channel_in_a_month(db, sql):
    run = run_risk_demo('Which payment channel brought in the most successful recharge amount in June 2026?', db=db)
    want = sql("""SELECT channel_id, sum(amount_cny) FROM transactions WHERE status = 'success'
                  AND ts >= DATE '2026-06-01' AND ts < DATE '2026-07-01' GROUP BY 1 ORDER BY 2 DESC LIMIT 1""")[0]
    assert tools_of(run) == [['list_datasets', 'create_procedure'], ['create_task'], ['run_task'], ['get_result'], []]
    assert re.search(rf'\b{want[0]}\b', run.answer) and f'{want[1]:,.0f}' in run.answer, run.answer
    assert f'{want[1]:,.0f}' in observed(run)


def test_difference_of_two_games_zh(db, sql):
    run = run_risk_demo('2026 年 6 月，Starfall Saga（g01）的成功充值额比 Iron Vanguard（g05）多多少元？', db=db)
    want = sql("""SELECT sum(amount_cny) FILTER (WHERE game_id = 'g01') - sum(amount_cny) FILTER (WHERE game_id = 'g05')
                  FROM transactions WHERE status = 'success' AND ts >= DATE '2026-06-01' AND ts < DATE '2026-07-01'""")
    got = float(re.search(r'多 ([\d,.-]+) CNY', run.answer)[1].replace(',', ''))
    assert abs(got - want[0][0]) <= 2, run.answer  # the tool rounds each amount to whole CNY


def test_shared_devices_none_in_april(db):
    run = run_risk_demo('Were any devices used to pay for at least 20 different accounts in April 2026? '
                        'Name them, or say that none were.', db=db)
    assert run.answer.startswith('None: 0 muid values'), run.answer
    assert not re.search(r'm[0-9a-f]{8}', run.answer)


def test_two_parts_velocity_then_shared_devices_zh(db):
    q = '2026 年 6 月在 10 分钟内发起至少 10 次支付的那些账号，有没有共用设备？如果有，列出被共用的设备；如果没有，请说明没有。'
    run = run_risk_demo(q, db=db)
    calls = [a for s in run.steps for a in s.actions]
    tasks = [a.args for a in calls if a.tool == 'create_task']
    assert len(tasks) == 2 and set(tasks[1]['filters']['user_id']) == set(re.findall(r'u\d{10}', run.answer))
    assert '没有' in run.answer and not re.search(r'm[0-9a-f]{8}', run.answer), run.answer


def test_outside_every_kind_is_declined(db):
    for q in ['What is the weather in Paris tomorrow?', '明天北京天气怎么样？',
              'In the game with the highest refund rate over the last 30 days, which channel refunded most?']:
        run = run_risk_demo(q, db=db)
        assert said_not_simulated(run) and not tools_of(run)[0], (q, run.answer)


def test_demo_questions_keep_their_kinds():
    kinds = {'Why did recharge volume jump last week?': 'spike', '上周充值量为什么上涨？': 'spike',
             '分析最近一个月两款游戏的充值异常情况': 'survey', 'Which accounts abuse refunds in the last month?': 'survey',
             'Why did recharge volume of Starfall Saga jump last week?': 'spike', 'Any proxy recharge?': 'survey',
             'Was last week\'s jump in recharge volume organic growth? Say what drove it.': 'spike',
             'Is there refund abuse in the last month? How many accounts refunded at least half of what they paid, '
             'among those with at least 5 payments?': 'survey'}
    assert {q: read_question(q).kind for q in kinds} == kinds
    assert read_ask('What is the weather in Paris tomorrow?') is None


@pytest.mark.parametrize('agent', ['react', 'rewoo', 'dag'])
def test_forecasts_and_days_outside_the_data_are_declined(db, agent):
    "Nothing in the tool results answers these: the analyst declines, never answers with a survey of the last month."
    for q in ['预测 2027 年每个渠道的充值额，并找出其中的风险', '预测 2027 年每个渠道的充值额会是多少？',
              'Forecast the recharge of each channel in 2027: any anomalies?',
              'Which channel brought in the most in March 2027?', '2025 年 5 月哪款游戏的成功充值金额最高？']:
        run = run_risk_demo(q, db=db, agent=agent)
        assert said_not_simulated(run), (agent, q, run.answer)
        assert not any(a.tool == 'run_task' for s in run.steps for a in s.actions), (agent, q)
        assert not re.search(r'\b[cg]\d\d\b|CNY', run.answer or ''), (agent, q, run.answer)


def planted_cause(db) -> list[str]:
    "What the spike's answer must name: its channel, its item and the ring's devices (the data's ground truth)."
    g = next(g for g in ground_truth(db) if g['pattern'] == 'channel_spike')
    return [g['channel_id'], *g['key_entities']['items'], *g['key_entities']['muids']]


@pytest.mark.parametrize('context', ['layered', 'window:3', 'window:2'])
def test_spike_under_a_context_policy(db, context):
    "Older steps summarised or left out of the prompt: the analysis goes on from what is kept, not from the start."
    full, run = run_risk_demo(SPIKE_QUESTION, db=db), run_risk_demo(SPIKE_QUESTION, db=db, context=context)
    assert run.stop_reason == 'answer' and tools_of(run) == tools_of(full), tools_of(run)
    assert all(v in run.answer for v in planted_cause(db)), run.answer


def test_layered_context_ablation_row_at_no_faults(tmp_path, db):
    "The ablation's 'layered context' row at faults 0: every demo task passes, as with the full context."
    tasks = [t for t in load_tasks() if 'demo' in t.tags]
    cfg = EvalConfig(**ABLATIONS['layered context'], name=ablation_name('layered context', 0.0))
    rows = rows_of(evaluate(tasks, [cfg], tmp_path, concurrency=2, db=db, progress=False), tasks, [cfg], [0])
    assert len(rows) == len(tasks) >= 5 and {r['status'] for r in rows} == {'passed'}, rows
