"""A real small model's replies, recorded once and replayed offline.

`tests/real_replies/record.py` ran Qwen2.5-Coder through llama.cpp (the `local` extra) on the risk questions in each
architecture and kept every exchange as a cassette, with what the live run did in `runs.json`. Here each cassette is
played back through the same architecture over the same dataset with no model: the replay sends the recorded
requests (a changed prompt is a `CassetteMismatch`) and must do what the live run did, call for call. The live lane
(`pytest -m live`) records them again against the model; a small model's sampling is not assumed to repeat, so it
checks only that every architecture runs to an end with the real model named in the trace."""
import json, sys
from pathlib import Path

import pytest

from reach_nb.llm.models import ReplayLLM, read_cassette
from reach_nb.risk.agents import risk_agent

HERE = Path(__file__).resolve().parent/'real_replies'
sys.path.insert(0, str(HERE))
from record import QUESTIONS, RUNS, summary  # noqa: E402

CASSETTES = sorted(HERE.glob('*/*.jsonl'))
LIVE_ONLY = {'recorded', 'question', 'seconds', 'model', 'simulated'}


def comparable(s:dict) -> dict:
    ("What a replay must reproduce. A call the server failed is not in the cassette, so its replay fails at once, "
     "without the HTTP client's retries: the `llm_error` is there, the `retry` before it is not.")
    return {k: [g for g in v if g != 'retry'] if k == 'safeguards' else v for k, v in s.items() if k not in LIVE_ONLY}


def recorded(cassette:Path) -> dict:
    return json.loads((cassette.parent/'runs.json').read_text(encoding='utf-8'))[cassette.stem]


def test_every_architecture_has_its_recordings():
    models = {c.parent.name for c in CASSETTES}
    assert models >= {'qwen2.5-coder-0.5b'}, models
    for m in models: assert {recorded(c)['recorded'] for c in CASSETTES if c.parent.name == m} == set(RUNS), m
    for c in CASSETTES: assert c.stem.startswith(recorded(c)['recorded'] + '-') and recorded(c)['question'] in QUESTIONS.values()


@pytest.mark.parametrize('cassette', CASSETTES, ids=lambda c: f'{c.parent.name}/{c.stem}')
def test_a_real_run_replays_offline_call_for_call(cassette):
    want = recorded(cassette)
    agent_name, kw = RUNS[want['recorded']]
    with risk_agent(ReplayLLM(cassette), agent=agent_name, **kw) as agent:
        run = agent.run(want['question'])
    got = summary(run)
    assert comparable(got) == comparable(want)
    assert not want['simulated'] and not got['simulated']
    models = {e['response'].model for e in read_cassette(cassette)}
    assert models == {want['model']} and 'qwen2.5-coder' in want['model'].lower(), models  # the real model, named


@pytest.mark.live
def test_the_real_model_runs_every_architecture_to_an_end(tmp_path, monkeypatch):
    "Needs the `local` extra; records into a scratch copy so the committed cassettes stay as they are."
    import record as rec
    monkeypatch.setattr(rec, 'HERE', tmp_path)
    monkeypatch.setattr(rec, 'QUESTIONS', {'spike': QUESTIONS['spike']})
    rec.record('qwen2.5-coder-0.5b', ['react', 'rewoo'])
    runs = json.loads((tmp_path/'qwen2.5-coder-0.5b'/'runs.json').read_text(encoding='utf-8'))
    assert sorted(runs) == ['react-spike', 'rewoo-spike']
    assert all(r['stop_reason'] and 'qwen2.5-coder' in r['model'].lower() and not r['simulated'] for r in runs.values())


# Replies the 0.5B model really wrote in those runs, each with what reach_nb should decide about it.
PAREN_PLAN = ("Plan: To answer this question, I'll analyze the recharge volume data for the transactions over the "
              "last week.\n\n#E1 = list_datasets(category='payments')\n#E2 = describe_dataset(dataset='transactions')\n"
              "#E3 = list_operators()\n#E4 = create_procedure(name='spike drivers', steps=[{\"operator\": "
              "\"concentration\", \"params\": {\"top\": 5}}, {\"operator\": \"trend\"}])")
PROSE_PLAN = ("To answer this question, I'll analyze the recharge volume data for the transactions over the last week. "
              "The recharge volume jumps last week because the transaction count increased by 10% in the previous week "
              "compared to the current week.\n\nHere's how I found out:\n\n1. **Identify the relevant dataset**: The "
              "recharge volume data is stored in the `transactions` dataset.")
PLAN_2 = ('{"thought": "Recharge volume jump likely occurred due to a data inconsistency or an error in the dataset '
          'retrieval process.", "decision": "plan 2", "answer": "The dataset retrieval process failed, and it needs t1, '
          'which failed."}')
POSITIONAL = ('{\n  "thought": "To find the game with the most refunds, we need to analyze the \'transactions\' dataset.",\n'
              '  "action": [\n    {"tool": "list_datasets", "args": ["payments"]},\n'
              '    {"tool": "describe_dataset", "args": ["transactions", "game_id=02"]}\n  ]\n}')


@pytest.fixture(scope='module')
def registry(tmp_path_factory):
    from reach_nb.risk.db import tiny_dataset
    from reach_nb.risk.tools import RiskWorkspace, risk_registry
    d = tmp_path_factory.mktemp('real')
    with RiskWorkspace(tiny_dataset(d/'tiny.duckdb'), store=d/'ws.sqlite') as ws: yield risk_registry(ws)


def test_a_rewoo_plan_written_as_the_tool_examples_are_is_read_as_a_repair(registry):
    "Its steps copy the prompt's examples, `tool(name=value)`, not the asked-for `tool[{...}]`: read, said to be repaired."
    from reach_nb.agents.rewoo import read_rewoo_plan
    plan = read_rewoo_plan(PAREN_PLAN, registry)
    assert [(t.call.tool, t.call.args) for t in plan.tasks][:3] == [
        ('list_datasets', {'category': 'payments'}), ('describe_dataset', {'dataset': 'transactions'}), ('list_operators', {})]
    assert plan.tasks[3].call.args['steps'][0] == {'operator': 'concentration', 'params': {'top': 5}}
    assert plan.repairs == ['parentheses_for_brackets']


def test_a_rewoo_plan_in_prose_is_refused_with_the_form_asked_for():
    "An essay with invented figures and no step: nothing to run; the model is told the form."
    from reach_nb.agents.rewoo import read_rewoo_plan
    with pytest.raises(ValueError, match=r'no plan: no line like "#E1 = tool\[arguments\]"'): read_rewoo_plan(PROSE_PLAN)


def test_a_dag_plan_cut_off_at_the_token_cap_runs_nothing():
    "The model repeated one task until its 1,024 tokens ran out: the reply is cut off, nothing is run."
    from reach_nb.parse import parse_json
    reply = read_cassette(HERE/'qwen2.5-coder-0.5b'/'dag-refunds.jsonl')[0]['response']
    assert reply.finish_reason == 'length' and reply.completion_tokens == 1024
    res = parse_json(reply.content)
    assert not res.ok and res.problem == 'truncated' and 'Nothing was run' in res.error


def test_a_dag_join_with_a_decision_it_was_not_offered_is_refused():
    "\"decision\": \"plan 2\" is neither answer nor replan; guessing either could be wrong, so it is asked again."
    from reach_nb.agents.dag import read_join
    with pytest.raises(ValueError, match='"decision": "answer" with the "answer", or "decision": "replan"'):
        read_join(json.loads(PLAN_2))


def test_positional_arguments_bind_in_parameter_order_and_one_too_many_is_refused(registry):
    "Two calls in a list, their arguments as lists: the first binds to its one parameter; the second has two values."
    from reach_nb.parse import parse_call, parse_json
    calls = [parse_call(a) for a in parse_json(POSITIONAL).value['action']]
    assert calls == [('list_datasets', {'_0': 'payments'}), ('describe_dataset', {'_0': 'transactions', '_1': 'game_id=02'})]
    first, second = (registry.call(*c) for c in calls)
    assert first.ok and '- transactions [payments]' in first.content
    assert not second.ok and second.error == 'bad_args' and 'too many positional arguments' in second.content


def test_an_invented_choice_is_refused_with_the_choices_and_an_example(registry):
    "category='transactions' (the dataset's name, not a category), which the model then sent twice more unchanged."
    o = registry.call('list_datasets', {'category': 'transactions'})
    assert not o.ok and o.error == 'bad_args'
    assert "expects one of 'payments', 'dimensions'" in o.content and "list_datasets(category='payments')" in o.content


ACTION_AS_ANSWER = ('{"thought": "The transactions dataset has 1,000,036 rows and covers the period from April 2 to June 30. '
                    'It includes fields such as user_id, muid, payer_id, game_id, item_id, channel_id, currency, amount, '
                    'amount_cny, status, and refund_ts.", "answer": {"thought": "To answer why recharge volume jumped last '
                    'week, I need to analyze the transactions dataset for the past week.", "action": {"tool": '
                    '"list_datasets", "args": {}}}}\n                    ')


def test_an_action_inside_the_answer_is_sent_back_not_taken_for_the_answer():
    "The 1.5B model's third ReAct reply on the spike question: its next call written as the answer. Once it ended the run."
    from reach_nb.agents.react import ReActAgent, decide
    from reach_nb.llm.models import ScriptedLLM
    from reach_nb.parse import parse_json
    res = parse_json(ACTION_AS_ANSWER)
    assert res.ok and res.level == 'strict'
    with pytest.raises(ValueError, match='The "answer" holds an action, not an answer'): decide(res.value)
    run = ReActAgent(ScriptedLLM([ACTION_AS_ANSWER, '{"thought": "t", "answer": "No jump found."}']), []).run('q')
    assert (run.stop_reason, run.answer, run.steps[0].parse_level) == ('answer', 'No jump found.', 'failed')
    assert [g.kind for g in run.steps[0].safeguards] == ['correction']
