"""Conversations with `Session`: the earlier turns in each new head under every context policy, prompts rebuilt exactly
from the store, a conversation carried on in another process, replies to the agent's questions, hostile sizes, and
long-term memory written and recalled across sessions in a DuckDB file with the default (packaged) embedder."""
import json, subprocess, sys, textwrap
import pytest
from reach_nb.llm.context import Layered, Window
from reach_nb.core import Run
from reach_nb.llm.models import FunctionLLM, ScriptedLLM, count_message_tokens
from reach_nb.memory.conversation import MAX_ANSWER, MAX_QUESTION, Session, facts_found, session_head
from reach_nb.agents.react import ReActAgent
from reach_nb.memory.recall import LongTermMemory
from reach_nb.memory.sessions import open_store
from reach_nb.tools import tool

FACTS = {'refund': 'Refund abuse: 41 accounts refunded more than 80% of their top-ups in June.',
         'proxy': 'Proxy recharge: 3 devices paid for 212 accounts through channel c07.'}


@tool
def search(query:str): # what to look for
    "Search the risk knowledge base."
    return '\n'.join(v for k, v in FACTS.items() if k in query.lower()) or 'No entry.'


def say(thought, tool=None, answer=None, **args):
    if tool is None: return json.dumps({'thought': thought, 'answer': answer})
    return json.dumps({'thought': thought, 'action': {'tool': tool, 'args': args}})


def analyst(sent):
    "A model that searches once per question, then answers from what its prompt says (earlier turns included)."
    def reply(messages, **kw):
        sent.append(messages)
        if messages[-1]['role'] == 'user' and not messages[-1]['content'].startswith('Observation'):
            return say('Look it up.', 'search', query=messages[-1]['content'])
        text = '\n'.join(m['content'] or '' for m in messages)
        return say('Answer.', answer='c07' if 'through channel c07' in text else 'unknown')
    return reply


@pytest.mark.parametrize('context', ['full', 'window:1', 'layered'])
def test_second_question_sees_the_first_answer_and_fact(context):
    sent = []
    chat = Session(ReActAgent(FunctionLLM(analyst(sent)), [search], context=context))
    first = chat.ask('Any proxy recharge?')
    second = chat.ask('Which channel did it use?')  # its search finds nothing: the fact must come from the first run
    assert (first.answer, second.answer) == ('c07', 'c07')
    head = sent[2]
    assert head[1]['content'] == 'Any proxy recharge?' and head[2]['content'].startswith('c07')
    assert 'through channel c07' in head[2]['content']
    for run, k in ((second, 2), (first, 0)):
        assert run.prompt_at(1) == sent[k] and run.prompt_at(2) == sent[k + 1]  # rebuilt exactly as sent


def test_without_a_session_the_fact_is_not_there():
    "The control: two separate runs, and the second cannot answer."
    sent = []
    agent = ReActAgent(FunctionLLM(analyst(sent)), [search])
    agent.run('Any proxy recharge?')
    assert agent.run('Which channel did it use?').answer == 'unknown'


def test_history_kept_by_each_policy():
    runs = [Run(question=f'Q{i}?', answer=f'A{i}. ' + ' '.join(f'c{j}:{i * j}%' for j in range(120))) for i in range(8)]
    agent = lambda ctx: ReActAgent(ScriptedLLM([]), [search], context=ctx)
    questions = lambda head: [m['content'].split('\n')[0] for m in head[1:-1:2]]
    assert questions(session_head(agent('full'), 'Q?', runs)) == [f'Q{i}?' for i in range(8)]
    assert questions(session_head(agent(Window(3)), 'Q?', runs)) == ['Q5?', 'Q6?', 'Q7?']
    lay = session_head(agent(Layered(budget=4000)), 'Q?', runs)
    assert questions(lay) and questions(lay)[-1] == 'Q7?' and len(questions(lay)) < 8
    assert count_message_tokens(lay[1:-1]) <= 1000 and lay[-1]['content'].endswith('earlier turns of this conversation not shown.)')


def test_hostile_sizes_are_capped():
    huge = 'x' * 200_000
    steps = [say('.', 'search', query=f'proxy {i}') for i in range(40)] + [say('.', answer=huge)]
    chat = Session(ReActAgent(ScriptedLLM(steps + [say('.', answer='ok')]), [search], max_steps=50))
    chat.ask('q' * 50_000)
    chat.ask('And?')
    turn = chat.agent.llm.calls[-1]['messages'][1:3]
    assert len(turn[0]['content']) == MAX_QUESTION
    assert len(turn[1]['content']) <= MAX_ANSWER + 8 * 220 and '(34 more)' in turn[1]['content']
    assert len(facts_found(chat.runs[0])) == 7


def test_reply_to_the_agent_question_is_recorded_and_reloaded(tmp_path):
    store = open_store(tmp_path/'s.sqlite')
    llm = ScriptedLLM([say('Which currency?', 'ask_user', question='CNY or USD?'), say('CNY.', answer='41,200 CNY.')])
    talk = Session(ReActAgent(llm, [search], ask_user=True), 'dora', store)
    paused = talk.ask('How much was refunded?')
    assert paused.stop_reason == 'needs_input' and talk.pending is not None
    reloaded = Session(ReActAgent(llm, [search], ask_user=True), 'dora', store)  # another process would do this
    assert reloaded.pending is not None and reloaded.turns == []
    done = reloaded.ask('CNY, please.')
    assert (done.answer, done.steps[0].observation) == ('41,200 CNY.', 'CNY, please.')
    infos = store.runs('dora')
    assert [i.parent for i in infos] == [None, infos[0].run_id] and infos[1].meta['user_message'] == 'CNY, please.'
    later = Session(ReActAgent(llm, [search], ask_user=True), 'dora', store)
    assert later.pending is None and [r.answer for r in later.turns] == ['41,200 CNY.']
    store.close()


CHILD = textwrap.dedent('''
    import json, sys
    from reach_nb.llm.models import ScriptedLLM
    from reach_nb.memory.conversation import Session
    from reach_nb.agents.react import ReActAgent
    from reach_nb.memory.sessions import open_store
    sys.path.insert(0, sys.argv[2])
    from test_memory_session import search, say
    llm = ScriptedLLM([say('Look.', 'search', query='refund'), say('Found.', answer='41 accounts abuse refunds.')])
    ReActAgent(llm, [search]).chat('Any refund abuse?', session_id='erin', store=open_store(sys.argv[1]))
''')


def test_conversation_carried_on_in_another_process(tmp_path):
    import pathlib
    db = tmp_path/'s.sqlite'
    subprocess.run([sys.executable, '-c', CHILD, str(db), str(pathlib.Path(__file__).parent)], check=True, timeout=120)
    llm = ScriptedLLM([say('Known.', answer='41.')])
    store = open_store(db)
    run = ReActAgent(llm, [search]).chat('How many accounts?', session_id='erin', store=store)
    sent = llm.calls[0]['messages']
    assert sent[1]['content'] == 'Any refund abuse?' and sent[2]['content'].startswith('41 accounts abuse refunds.')
    assert "search(query='refund') → Refund abuse: 41 accounts" in sent[2]['content']
    assert store.run(run.meta['run_id']).prompt_at(1) == sent
    store.close()


def test_long_term_memory_written_and_recalled_across_sessions(tmp_path):
    path = tmp_path/'longterm.duckdb'
    llm = ScriptedLLM([say('Look.', 'search', query='proxy'), say('Found.', answer='A proxy ring paid through c07.'),
                       *[say('.', answer='Noted.')] * 3])
    with LongTermMemory(path) as ltm:
        s = Session(ReActAgent(llm, [search]), 'week1', memory=ltm)
        for message in ('Is there proxy recharge?', 'Yes, confirmed.', 'From now on please report all money amounts in CNY.',
                        'No, c09 is a discount reseller, not an official channel.'):
            s.ask(message)
        assert [(e.kind, e.text[:20]) for e in s.learned] == [
            ('finding', 'A proxy ring paid th'), ('preference', 'From now on please r'), ('correction', 'No, c09 is a discoun')]
        assert len(ltm) == 3
    with LongTermMemory(path) as ltm:  # the file again, as next week's process would open it
        llm = ScriptedLLM([say('.', answer='Remembered.')] * 3)
        s = Session(ReActAgent(llm, [search]), 'week2', memory=ltm)
        for q in ('Is channel c09 an official channel?', '金额要用哪种货币展示？', 'Which channel did the proxy ring use?'):
            s.ask(q)  # the second asks "which currency should amounts be shown in?" in Chinese
        systems = [c['messages'][0]['content'] for c in llm.calls]
        assert '- [correction] No, c09 is a discount reseller, not an official channel.' in systems[0]
        assert '- [preference] From now on please report all money amounts in CNY.' in systems[1]
        assert '- [finding] A proxy ring paid through c07.' in systems[2]
        assert 'Long-term memory' not in s.head("What's the weather in Shanghai tomorrow?")[0]['content']
        assert s.runs[1].prompt_at(1) == llm.calls[1]['messages'] and s.runs[1].meta['session_id'] == 'week2'


@pytest.mark.parametrize('arch', ['plan-execute', 'rewoo', 'dag'])
def test_a_planner_conversation_answers_a_follow_up(arch, tmp_path):
    "A follow-up ('And in which game?') in a planner's session: every role is told the conversation, and it answers."
    from reach_nb.agents.registry import make_agent, role_in
    from reach_nb.risk.agents import data_note, risk_tools
    from reach_nb.risk.analysis import SPIKE_QUESTION
    from reach_nb.risk.analyst import SimAnalyst
    from reach_nb.risk.data import ensure_dataset
    from reach_nb.risk.tools import RiskWorkspace
    sent = []
    class Telling(SimAnalyst):
        def _complete(self, messages, *a): sent.append(messages); return super()._complete(messages, *a)
    with RiskWorkspace(ensure_dataset(), store=tmp_path/'ws.sqlite') as ws:
        chat = Session(make_agent(arch, Telling(), risk_tools(ws), data_note(ws)))
        first = chat.ask(SPIKE_QUESTION)
        n = len(sent)
        second = chat.ask('And in which game?')
    assert (first.stop_reason, second.stop_reason) == ('answer', 'answer')
    assert 'g02' in second.answer and 'cannot simulate' not in second.answer, second.answer
    for m in sent[n:]:  # the planner in its background, the roles after it before the question
        told = '\n'.join(x['content'] for x in m if isinstance(x.get('content'), str))
        assert f'- asked: {SPIKE_QUESTION}' in told, (role_in(m), told[:300])
