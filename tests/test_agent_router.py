"The router: its rules on examples, the `Routed` event, chat without tools, the model path, one run, accuracy."
import json
from pathlib import Path
import pytest
from reach_nb.core import *
from reach_nb.llm.models import FunctionLLM, ScriptedLLM
from reach_nb.agents.react import ReActAgent
from reach_nb.agents.router import *

QUESTIONS = Path(__file__).resolve().parent.parent / 'data' / 'router' / 'questions.jsonl'

class Stub:
    "A stand-in agent (anything with `stream`): `steps` steps, then an answer; or it breaks."
    def __init__(self, answer='done', steps=1, fail=False, end=True):
        self.answer, self.steps, self.fail, self.end, self.asked = answer, steps, fail, end, []
    def stream(self, question):
        self.asked.append(question)
        yield RunStart(question=question, agent='stub', model='stub-model', meta={'simulated': True})
        for i in range(1, self.steps + 1):
            yield StepStart(index=i)
            if self.fail: raise RuntimeError('the stand-in broke')
            yield TaskStart(task=f't{i}', index=i)
            yield StepEnd(step=Step(index=i, usage=Usage(llm_calls=1, prompt_tokens=10)))
        if self.end:
            usage = Usage(llm_calls=self.steps, prompt_tokens=10 * self.steps)
            yield RunEnd(answer=self.answer, stop_reason='answer', usage=usage)

def agents(**kw):
    "One stand-in per agent id, so a test sees which one ran."
    ids = ('chat', 'react', 'plan-execute', 'rewoo', 'dag')
    return {k: kw.get(k.replace('-', '_'), Stub(answer=k)) for k in ids}

# Examples written for these tests, not taken from the labelled set.
RULE_EXAMPLES = [
    ('Hello!', 'chat'), ('Thank you so much', 'chat'), ('What is an account takeover?', 'chat'),
    ('请问什么是洗钱？', 'chat'), ('您好', 'chat'),
    ('How many users recharged on Cloud Kingdom Chess yesterday?', 'react'), ('统计一下 c03 本月的交易笔数', 'react'),
    ('What is the refund rate of c02 this month?', 'react'),
    ('Why are refunds on c05 so high this month?', 'plan-execute'), ('g06 上周订单暴涨的原因是什么？', 'plan-execute'),
    ('Investigate the new accounts on TopUp Hub', 'plan-execute'),
    ('Write a short report on last month', 'rewoo'), ('帮我出一份上月的风控月报', 'rewoo'),
    ('Find the top game last week, then show its daily trend', 'rewoo'),
    ('Compare refunds on c02 versus c03', 'dag'), ('g01、g02、g03 上周的充值金额', 'dag'),
    ('Recharges this month and last month', 'dag'), ('三个钱包渠道的退款率', 'dag'),
]

@pytest.mark.parametrize('question,agent', RULE_EXAMPLES)
def test_each_rule_on_examples(question, agent):
    v = Rules()(question)
    assert (v.agent, v.sure) == (agent, True), v.reason
    assert v.reason.startswith(f'{agent}: ')

def test_rules_unsure_when_nothing_or_several_fire():
    none = Rules()('Hmm.')
    assert (none.agent, none.sure, none.reason) == (None, False, 'no rule fired')
    both = Rules()('Why did c08 spike last week? Then write a report.')
    assert (both.agent, both.sure) == ('plan-execute', False)
    assert 'also rewoo' in both.reason

def test_a_greeting_with_data_is_not_chat():
    assert Rules()('Hi, what was the refund rate of g01 last week?').agent == 'react'
    assert Rules()('你好，对比一下 g01 和 g02').agent == 'dag'

def test_rules_read_a_capped_start_of_the_question():
    rules = Rules(max_chars=100)
    assert rules('x ' * 60 + 'why did it spike?').agent is None
    assert Rules()('why ' + 'a' * 1_000_000).agent == 'plan-execute'  # a huge question is read, capped, at once

def test_rules_can_be_extended():
    rules = Rules(cues={'report': (r'dossier', r'档案')})
    assert rules('Build a dossier on g01').agent == 'rewoo'
    assert rules('Write a report on g01').agent == 'react'  # the default 'report' words were replaced

def test_routed_event_and_reason_in_the_trace(tmp_path):
    router = RouterAgent(agents())
    evs = list(router.stream('Compare refunds on c02 versus c03'))
    assert [e.type for e in evs[:2]] == ['run_start', 'route']
    assert (evs[0].agent, evs[0].meta['architecture']) == ('router', 'router')
    assert [e.type for e in evs].count('run_start') == 1 and [e.type for e in evs].count('run_end') == 1
    assert evs[-1].type == 'run_end' and evs[-1].answer == 'dag'
    back = Run.load(Run.from_events(evs).save(tmp_path / 'routed.jsonl'))
    route = next(e for e in back.extra if e.type == 'route')
    assert (route.agent, route.by) == ('dag', 'rules')
    assert "'compare'" in route.reason and 'versus' in route.reason
    assert back.meta['routed_to'] == 'dag' and back.meta['sub_run']['agent'] == 'stub'

def recorder():
    "A tool that records its calls, and a ReAct agent whose scripted model calls it (if it is ever asked)."
    calls = []
    def lookup(metric:str): # e.g. 'refund_rate'
        "Look up one metric."
        calls.append(metric)
        return '2.1%'
    act = json.dumps({'thought': 'look', 'action': {'tool': 'lookup', 'args': {'metric': 'refund_rate'}}})
    llm = ScriptedLLM([act, json.dumps({'thought': 'ok', 'answer': 'It is 2.1%.'})] * 10)
    return calls, ReActAgent(llm, [lookup])

@pytest.mark.parametrize('question', ['Hi there!', 'What is a chargeback?', '什么是代充？', '谢谢，辛苦了！'])
def test_a_chat_question_never_calls_a_tool(question):
    calls, react = recorder()
    chat_llm = ScriptedLLM(['Happy to help.'])
    run = RouterAgent({'chat': ChatAgent(chat_llm), 'react': react}).run(question)
    assert calls == []
    assert (run.extra[0].agent, run.answer, run.usage.tool_calls) == ('chat', 'Happy to help.', 0)
    assert chat_llm.calls[0]['tools'] is None

def test_chat_agent_does_not_run_a_tool_call_the_model_writes():
    calls, react = recorder()
    text = json.dumps({'thought': 'look', 'action': {'tool': 'lookup', 'args': {'metric': 'refund_rate'}}})
    run = ChatAgent(ScriptedLLM([text])).run('What is a chargeback?')
    assert calls == [] and run.answer == text and run.steps[0].actions == []
    assert (run.stop_reason, run.usage.llm_calls, run.usage.tool_calls) == ('answer', 1, 0)

def test_chat_agent_survives_a_failing_or_empty_model():
    def down(messages, **kw): raise ConnectionError('down')
    run = ChatAgent(FunctionLLM(down)).run('hi')
    assert run.stop_reason == 'llm_error' and run.steps[0].safeguards[0].kind == 'llm_error'
    run = ChatAgent(ScriptedLLM(['   '])).run('hi')
    assert [g.kind for g in run.steps[0].safeguards] == ['validation']
    run = ChatAgent(ScriptedLLM(['ok']), max_chars=10).run('x' * 50)
    assert [g.kind for g in run.steps[0].safeguards] == ['size_cap']

def test_the_model_decides_when_the_rules_are_unsure():
    llm = ScriptedLLM(['{"agent": "dag", "reason": "Two channels to compare."}'])
    run = RouterAgent(agents(), llm=llm).run('Hmm.')
    route = run.extra[0]
    assert (route.agent, route.by, run.answer) == ('dag', 'model', 'dag')
    assert route.reason == 'model: Two channels to compare. (rules unsure: no rule fired)'
    assert 'Question: Hmm.' in llm.calls[0]['messages'][1]['content'] and llm.calls[0]['json_mode']

def test_the_model_is_not_asked_when_the_rules_are_sure_unless_always():
    llm = ScriptedLLM(['{"agent": "rewoo", "reason": "A report."}'])
    run = RouterAgent(agents(), llm=llm).run('Compare refunds on c02 versus c03')
    assert (run.extra[0].agent, run.extra[0].by, llm.calls) == ('dag', 'rules', [])
    run = RouterAgent(agents(), llm=llm, ask_model='always').run('Compare refunds on c02 versus c03')
    assert (run.extra[0].agent, run.extra[0].by, len(llm.calls)) == ('rewoo', 'model', 1)

def test_a_malformed_model_reply_gets_a_correction_round():
    llm = ScriptedLLM(['Send it to the DAG agent.', '{"reason": "no agent"}', '{"agent": "dag", "reason": "compare"}'])
    router = RouterAgent(agents(dag=Stub('compared', steps=2)), llm=llm, max_corrections=2)
    run = router.run('Hmm.')
    assert [s.index for s in run.steps] == [1, 2, 3, 4, 5]
    assert [s.parse_level for s in run.steps[:3]] == ['failed', 'failed', 'strict']
    assert llm.calls[1]['messages'][-1]['content'].startswith('Your last reply could not be used.')
    assert 'needs "agent"' in llm.calls[2]['messages'][-1]['content']
    assert (run.extra[0].agent, run.extra[0].index, run.answer) == ('dag', 3, 'compared')
    assert [e.index for e in run.extra[1:]] == [4, 5]  # the agent's task events moved with its steps

def test_an_unusable_model_leaves_the_decision_to_the_rules():
    llm = ScriptedLLM(['nope', 'still nope'])
    run = RouterAgent(agents(), llm=llm, ask_model='always').run('Why did c08 spike?')
    assert (run.extra[0].agent, run.extra[0].by) == ('plan-execute', 'rules')
    assert run.extra[0].reason.endswith("(the model's reply could not be used)")
    def down(messages, **kw): raise ConnectionError('down')
    run = RouterAgent(agents(), llm=FunctionLLM(down), ask_model='always').run('Hmm.')
    assert (run.extra[0].agent, run.steps[0].safeguards[0].kind, run.stop_reason) == ('react', 'llm_error', 'answer')

@pytest.mark.parametrize('said', ['sql-wizard', 'x' * 10_000], ids=['made-up', 'huge'])
def test_an_unknown_agent_id_from_the_model_falls_back_to_the_default(said):
    llm = ScriptedLLM([json.dumps({'agent': said, 'reason': 'mine'})])
    run = RouterAgent(agents(), llm=llm, default='chat').run('Hmm.')
    route = run.extra[0]
    assert (route.agent, route.by, run.answer) == ('chat', 'model', 'chat')
    assert 'which is not a registered agent' in route.reason and "so the default 'chat'" in route.reason
    assert len(route.reason) < 500

def test_model_ids_are_matched_ignoring_case_and_punctuation():
    llm = ScriptedLLM(['{"agent": "Plan_Execute", "reason": "why"}'])
    assert RouterAgent(agents(), llm=llm).route('Hmm.').agent == 'plan-execute'

def test_a_rule_choice_that_is_not_registered_falls_back():
    route = RouterAgent({'react': Stub(), 'chat': Stub()}).route('Compare g01 and g02')
    assert route.agent == 'react' and "'dag' is not registered here, so the default 'react'" in route.reason

def test_one_run_with_reindexed_steps_and_summed_usage():
    calls, react = recorder()
    llm = ScriptedLLM(['{"agent": "react", "reason": "one metric"}'])
    run = RouterAgent({'react': react, 'dag': Stub()}, llm=llm).run('Hmm.')
    assert [s.index for s in run.steps] == [1, 2, 3] and calls == ['refund_rate']
    assert (run.agent, run.answer, run.stop_reason) == ('router', 'It is 2.1%.', 'answer')
    assert run.usage.llm_calls == 3 and run.usage.tool_calls == 1
    assert run.meta['sub_run']['meta']['mode'] == 'json'  # the sub-run's start, kept in the meta

@pytest.mark.parametrize('stub', [Stub(fail=True), Stub(end=False, steps=2)])
def test_an_agent_that_breaks_ends_the_run_with_an_error(stub):
    run = RouterAgent({'react': stub}).run('How many refunds last week?')
    last = run.steps[-1]
    assert run.stop_reason == 'error' and last.safeguards[0].kind == 'internal_error'
    assert [s.index for s in run.steps] == list(range(1, len(run.steps) + 1))

def test_broken_rules_do_not_break_the_run():
    def rules(q): raise ValueError('bad rules')
    run = RouterAgent(agents(), rules=rules).run('Hmm.')
    assert run.extra[0].agent == 'react' and 'the rules failed (ValueError: bad rules)' in run.extra[0].reason

def test_router_configuration_errors_say_what_to_do():
    with pytest.raises(UserError, match='no agents'): RouterAgent({})
    with pytest.raises(UserError, match=r"the default 'react' is not a registered agent.*pick one of \['chat'\]"):
        RouterAgent({'chat': Stub()})
    with pytest.raises(UserError, match="use 'unsure'"): RouterAgent(agents(), ask_model='sometimes')
    with pytest.raises(TypeError): list(RouterAgent(agents()).stream(None))

def test_the_labelled_set():
    items = load_questions(QUESTIONS)
    assert len(items) >= 60 and {i['language'] for i in items} == {'en', 'zh'}
    assert {i['label'] for i in items} == {'chat', 'react', 'dag', 'plan-execute', 'rewoo'}
    assert {i['split'] for i in items} == {'dev', 'heldout'}
    assert len({i['question'] for i in items}) == len(items)

# Measured with the rules as first written: dev 62/64 (97%), heldout 21/30 (70%), all 83/94 (88%).
@pytest.mark.parametrize('split,floor', [('dev', 0.90), ('heldout', 0.60), (None, 0.80)])
def test_rules_accuracy_floor(split, floor):
    items = [i for i in load_questions(QUESTIONS) if split is None or i['split'] == split]
    s = score(items, lambda q: Rules()(q).agent or 'react')
    assert s['accuracy'] >= floor, confusion_table(s)
