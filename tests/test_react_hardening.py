"""The ReAct loop's protocol fidelity and robustness, through its public API (`ReActAgent`, `decide`, `system_prompt`,
`DIALECTS`). Each test names the behaviour it pins down; the notebook `21_react` shows the same with its code."""
import json

import pytest

from reach_nb.core import Observation, Safeguard, ToolCall
from reach_nb.llm.models import ChatModel, LLMResponse, ScriptedLLM
from reach_nb.agents.react import DIALECTS, PROTOCOL, ReActAgent, decide, system_prompt
from reach_nb.tools import ToolRegistry, tool

FACTS = {'refund abuse': 'Refund abuse: 41 accounts refunded more than 80% of their top-ups in June.',
         'proxy recharge': 'Proxy recharge: 3 devices paid for 212 accounts through one discount channel.'}


@tool
def search(query: str,  # what to look for
           limit: int = 3):  # how many hits at most
    "Search the risk knowledge base."
    hits = [v for k, v in FACTS.items() if any(w in k for w in query.lower().split())]
    return '\n'.join(hits[:limit]) or f'No entry matches {query!r}.'


@tool
def add(a: float, b: float):  # two numbers
    "Add two numbers."
    return a + b


def say(thought, tool=None, answer=None, **args):
    if tool is None: return json.dumps({'thought': thought, 'answer': answer})
    return json.dumps({'thought': thought, 'action': {'tool': tool, 'args': args}})


def kinds(run): return [(s.index, g.kind) for s in run.steps for g in s.safeguards]


# --- decide reads every dialect ---------------------------------------------------------------------------------

@pytest.mark.parametrize('reply, answer', [
    ({'type': 'FinalAnswer', 'content': 'ring'}, 'ring'),
    ({'FinalAnswer': 'ring'}, 'ring'),
    ({'type': 'final_answer', 'content': 'ring'}, 'ring'),
    ({'Thought': 't', 'Conclusion': 'ring'}, 'ring'),
])
def test_decide_reads_final_answers(reply, answer):
    assert decide(reply).answer == answer


@pytest.mark.parametrize('reply, args', [
    ({'type': 'function', 'function': {'name': 'search', 'arguments': '{"query": "x"}'}}, {'query': 'x'}),
    ({'type': 'function', 'function': {'name': 'search', 'arguments': {'query': 'x'}}}, {'query': 'x'}),
    ({'name': 'search', 'arguments': {'query': 'x'}}, {'query': 'x'}),
    ({'name': 'search', 'parameters': {'query': 'x'}}, {'query': 'x'}),
    ({'Thought': 't', 'Action': {'function': 'search', 'parameters': {'query': 'x'}}}, {'query': 'x'}),
    ({'Thought': 't', 'Action': {'function': 'search', 'parameters': '{"query": "x"}'}}, {'query': 'x'}),
    ({'Thought': 't', 'Action': {'function': 'search', 'parameters': "{'query': 'x', 'limit': 2}"}},
     {'query': 'x', 'limit': 2}),
    ({'type': 'tool_call', 'tool_name': 'search', 'tool_args': {'query': 'x'}, 'reason': 'r'}, {'query': 'x'}),
])
def test_decide_reads_calls_in_every_dialect(reply, args):
    d = decide(reply)
    assert (d.answer, [(c.tool, c.args) for c in d.calls]) == (None, [('search', args)])


def test_a_conclusion_beside_an_action_is_kept_and_reaches_the_step():
    reply = {'Thought': 't', 'Action': {'function': 'search', 'parameters': {'query': 'proxy'}},
             'Conclusion': 'a ring, so far'}
    d = decide(reply)
    assert (len(d.calls), d.answer, d.conclusion) == (1, None, 'a ring, so far')
    llm = ScriptedLLM([json.dumps(reply), say('Done.', answer='A ring.')])
    run = ReActAgent(llm, [search], dialect='risk').run('q')
    assert (run.steps[0].conclusion, run.steps[0].action.tool, run.answer) == ('a ring, so far', 'search', 'A ring.')


def test_decide_on_pathological_values_raises_only_value_errors():
    deep = {}
    for _ in range(10_000): deep = {'action': deep}
    with pytest.raises(ValueError): decide(deep)
    assert decide({1: 'x', None: 'y', 'answer': 'ok'}).answer == 'ok'
    with pytest.raises(ValueError): decide({'action': {'tool': 'search', 'args': {1: 'x'}}})
    assert decide({'thought': {'plan': [1]}, 'answer': 42}).thought == '{"plan": [1]}'


# --- dialects -----------------------------------------------------------------------------------------------------

REPLIES = {'default': (say('Look.', 'search', query='proxy'), say('Done.', answer='A ring.')),
           'risk': (json.dumps({'Thought': 'Look.',
                                'Action': {'function': 'search', 'parameters': {'query': 'proxy'}}}),
                    json.dumps({'Thought': 'Done.', 'Conclusion': 'A ring.'})),
           'reach': (json.dumps({'type': 'tool_call', 'tool_name': 'search', 'tool_args': {'query': 'proxy'},
                                 'reason': 'Look.'}), json.dumps({'type': 'final_answer', 'content': 'A ring.'}))}


@pytest.mark.parametrize('name', list(REPLIES))
def test_each_dialect_is_spoken_and_understood(name):
    d, (call, done) = DIALECTS[name], REPLIES[name]
    llm = ScriptedLLM(['Let me think first.', call, done])
    run = ReActAgent(llm, [search], dialect=name).run('Any proxy recharge?')
    assert (run.stop_reason, run.answer, run.steps[1].action.tool) == ('answer', 'A ring.', 'search')
    system, correction = llm.calls[0]['messages'][0]['content'], llm.calls[1]['messages'][-1]['content']
    assert d.protocol in system and all(o.protocol not in system for o in DIALECTS.values() if o is not d)
    assert f'Expected format: {d.reminder}' in correction
    capped = ScriptedLLM([call, done])
    run = ReActAgent(capped, [search], dialect=name, max_steps=1).run('Any proxy recharge?')
    assert capped.calls[1]['messages'][-1]['content'] == d.step_limit
    assert (run.stop_reason, run.answer) == ('max_steps', 'A ring.')


def test_system_template_placeholders():
    reg = ToolRegistry([search])
    p = system_prompt(reg, 'Q: {question}\nKnow: {background}\n{history}Tools: {tools}\nFormat: {protocol}',
                      question='Why?', background='CNY')
    assert p.startswith('Q: Why?\nKnow: CNY\nTools: ## search') and p.endswith(PROTOCOL)
    with pytest.raises(ValueError, match=r'Unknown placeholder \{tool_list\}.*\{tools\}'):
        ReActAgent(ScriptedLLM([]), reg, system='Tools: {tool_list}')
    with pytest.raises(ValueError, match='Unknown dialect'): ReActAgent(ScriptedLLM([]), reg, dialect='hermes')
    agent = ReActAgent(ScriptedLLM([say('Done.', answer='ok')]), reg, background='Amounts are in CNY.')
    assert 'Amounts are in CNY.' in agent.run('q').prompt_at(1)[0]['content']


# --- native mode --------------------------------------------------------------------------------------------------

def test_native_mode_prompt_is_about_function_calling():
    llm = ScriptedLLM([LLMResponse(content='A ring.')])
    ReActAgent(llm, [search], mode='native').run('q')
    system = llm.calls[0]['messages'][0]['content']
    assert 'function-calling interface' in system and PROTOCOL not in system and '"answer"' not in system


@pytest.mark.parametrize('content, repair', [
    ('<tool_call>{"name": "search", "arguments": {"query": "proxy"}}</tool_call>', 'hermes_tool_call'),
    ('[TOOL_CALLS] [{"name": "search", "arguments": {"query": "proxy"}}]', 'mistral_tool_calls'),
    ('<|python_tag|>{"name": "search", "parameters": {"query": "proxy"}}', 'llama_python_tag'),
    ('{"name": "search", "arguments": {"query": "proxy"}}', 'bare_json_call'),
    (say('Look.', 'search', query='proxy'), 'protocol_json'),
])
def test_native_calls_written_in_the_text_are_used_as_repairs(content, repair):
    llm = ScriptedLLM([content, 'A proxy-recharge ring.'])
    run = ReActAgent(llm, [search], mode='native').run('q')
    s = run.steps[0]
    assert (run.stop_reason, run.answer) == ('answer', 'A proxy-recharge ring.')
    assert (s.action.tool, s.parse_level) == ('search', 'repaired')
    assert repair in s.repairs and [g.kind for g in s.safeguards] == ['repair'] and 'Proxy recharge' in s.observation
    assert [m['role'] for m in llm.calls[1]['messages'][-2:]] == ['assistant', 'tool']


def test_native_json_answer_gives_its_text():
    run = ReActAgent(ScriptedLLM([say('Done.', answer='A ring.')]), [search], mode='native').run('q')
    assert (run.answer, run.steps[0].thought) == ('A ring.', 'Done.')


def test_native_step_limit_asks_for_plain_text():
    call = LLMResponse(tool_calls=[ToolCall(tool='search', args={'query': 'proxy'})])
    llm = ScriptedLLM([call, 'A ring of 3 devices.'])
    run = ReActAgent(llm, [search], mode='native', max_steps=1).run('q')
    assert (run.stop_reason, run.answer, llm.calls[1]['tools'], llm.calls[1]['json_mode']) == \
        ('max_steps', 'A ring of 3 devices.', None, False)


def test_json_mode_uses_tool_call_tags_without_corrections():
    tags = '<tool_call>{"name": "search", "arguments": {"query": "proxy"}}</tool_call>'
    run = ReActAgent(ScriptedLLM([tags, say('Done.', answer='ok')]), [search]).run('q')
    assert (len(run.steps), run.steps[0].repairs, kinds(run)) == (2, ['hermes_tool_call'], [(1, 'repair')])


# --- reasoning and usage ------------------------------------------------------------------------------------------

def test_reasoning_usage_and_retries_are_recorded():
    first = LLMResponse(content='<think>Proxy first.</think>' + say('Look.', 'search', query='proxy'), retries=2)
    second = LLMResponse(content=say('Done.', answer='A ring.'), reasoning='It is a ring.', reasoning_tokens=12,
                         prompt_tokens=100, completion_tokens=20)
    run = ReActAgent(ScriptedLLM([first, second]), [search]).run('q')
    assert [s.reasoning for s in run.steps] == ['Proxy first.', 'It is a ring.']
    assert run.steps[0].parse_level == 'strict' and run.steps[0].action.tool == 'search'
    assert (run.usage.estimated_calls, run.usage.reasoning_tokens) == (1, 12)
    assert kinds(run) == [(1, 'retry')] and '2 times' in run.steps[0].safeguards[0].detail


# --- the repeat guard ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize('first, second', [
    ({'query': 'refund', 'limit': '5'}, {'query': 'refund', 'limit': 5}),
    ({'keyword': 'refund'}, {'query': 'refund'}),
    ({'query': 'refund'}, {'query': 'refund', 'limit': 3}),
])
def test_repeats_are_compared_as_the_registry_runs_them(first, second):
    script = [json.dumps({'thought': 't', 'action': {'tool': 'search', 'args': a}}) for a in (first, second)]
    run = ReActAgent(ScriptedLLM(script + [say('Done.', answer='ok')]), [search]).run('q')
    assert (kinds(run), run.usage.tool_calls) == ([(2, 'intervention')], 1)
    assert 'Refund abuse' in run.steps[1].observation


def test_a_cycle_is_a_repeat_and_the_intervention_restates_the_result():
    cycle = [say('A', 'search', query='proxy'), say('B', 'add', a=1, b=2)] * 2
    run = ReActAgent(ScriptedLLM(cycle), [search, add]).run('q')
    assert (kinds(run), run.stop_reason) == ([(3, 'intervention'), (4, 'repeat_stop')], 'repeated')
    assert run.steps[2].observation.startswith("You already called search(query='proxy') in step 1 and got:\nProxy")


# --- the step limit -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize('last', ['{"thought": "ok", "answer": "Both."}', 'no idea', ''])
def test_the_step_limit_answer_is_on_the_last_step_only(last):
    script = [say(f'Search {q}.', 'search', query=q) for q in ('refund', 'proxy')] + [last]
    run = ReActAgent(ScriptedLLM(script), [search], max_steps=2).run('q')
    assert run.stop_reason == 'max_steps' and [s.answer for s in run.steps][:-1] == [None, None]
    assert run.steps[-1].answer == run.answer and run.answer.count('Proxy recharge') <= 1


# --- nothing crashes the loop -------------------------------------------------------------------------------------

class BrokenCallMany(ToolRegistry):
    "A registry whose own machinery fails (not a tool: the registry)."
    def call_many(self, calls): raise LookupError('the tool index is corrupt')


class BrokenCall(ToolRegistry):
    "A registry whose single-call path fails with an exception type no tool raises."
    def call(self, name, args=None, call_id=None): raise LookupError('the tool index is corrupt')


@pytest.mark.parametrize('registry', [BrokenCallMany, BrokenCall])
def test_a_failing_registry_is_an_internal_error_not_a_crash(registry):
    script = [say('Look.', 'search', query='x'), say('Down.', answer='down')]
    run = ReActAgent(ScriptedLLM(script), registry([search])).run('q')
    assert (run.stop_reason, kinds(run)) == ('answer', [(1, 'internal_error')])
    assert 'LookupError: the tool index is corrupt' in run.steps[0].safeguards[0].detail
    assert not run.steps[0].observations[0].ok
    script = [say(f'Try {i}.', 'search', query=f'x{i}') for i in range(5)]
    run = ReActAgent(ScriptedLLM(script), registry([search])).run('q')
    assert (run.stop_reason, len(run.steps)) == ('error', 3) and run.answer.startswith('No conclusion was reached')


class Unchecked(ChatModel):
    "A model whose replies are passed on exactly as built, even in shapes no backend should produce."
    def __init__(self, replies): super().__init__('unchecked'); self.replies = list(replies)
    def _complete(self, *args): return self.replies.pop(0)


def test_an_exception_while_handling_a_reply_is_a_correction_round():
    bad = LLMResponse.model_construct(content='', tool_calls=[{'tool': 'search'}])
    run = ReActAgent(Unchecked([bad, LLMResponse(content='A ring.')]), [search], mode='native').run('q')
    assert (run.stop_reason, run.answer, kinds(run)) == ('answer', 'A ring.', [(1, 'internal_error')])
    told = run.prompt_at(run.steps[1].index)[-1]
    assert told['role'] == 'user' and told['content'].startswith('Your last reply could not be handled')


def test_a_bug_outside_any_step_ends_the_run_with_error():
    agent = ReActAgent(ScriptedLLM([say('Done.', answer='ok')]), [search])
    agent.max_steps = 'many'
    events = list(agent.stream('q'))
    assert (events[-1].type, events[-1].stop_reason) == ('run_end', 'error')
    assert events[-2].step.safeguards[0].kind == 'internal_error'


def test_actions_per_step_are_capped():
    ten = json.dumps({'thought': 'All.', 'actions': [{'tool': 'add', 'args': {'a': i, 'b': 0}} for i in range(10)]})
    run = ReActAgent(ScriptedLLM([ten, say('Done.', answer='ok')]), [add]).run('q')
    obs = run.steps[0].observations
    assert (run.usage.tool_calls, len(obs), [o.ok for o in obs].count(False)) == (8, 10, 2)
    assert obs[-1].content.startswith('Not run: one step runs at most 8 calls') and kinds(run) == [(1, 'size_cap')]
