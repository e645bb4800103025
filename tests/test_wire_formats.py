"""The wire formats real OpenAI-compatible servers use, through the real `openai` client over real HTTP.

The local model server answers in each format of `reach_nb.llm.server.WIRES` (tool calls as OpenAI sends them,
with the arguments as an object, written into the content in a model's own syntax; reasoning in a field or a
`<think>` block; no usage block). Each row runs twice:
- at the LLM level: what `OpenAIChat` returns, streamed and not, for a tool call and for an answer;
- at the agent level: a `ReActAgent` in both modes ('json' and 'native'), streamed and not, must call the right
  tool, give the right answer, keep the reasoning on the step, and count estimated usage only when no usage came.
"""
import json

import pytest

from reach_nb.core import ToolCall
from reach_nb.llm.models import FunctionLLM, LLMResponse, OpenAIChat
from reach_nb.llm.server import IN_CONTENT, WIRES, ModelServer, wire_format
from reach_nb.agents.react import ReActAgent

QUESTION = 'Is merchant M-7 a chargeback risk?'
CALL = ToolCall(tool='merchant_profile', args={'merchant_id': 'M-7'})
OUTPUT = 'merchant M-7: CB-14, fourteen chargebacks in the last 7 days'
ANSWER = 'Yes: M-7 had fourteen chargebacks in the last week, a high risk.'
THINK_CALL, THINK_ANSWER = 'I should look the merchant up first.', 'The profile settles it.'
REASONED = {'think', 'reasoning-content'}  # formats that carry the reasoning to the client


def merchant_profile(merchant_id: str) -> str:
    "The chargeback profile of a merchant."
    return f'merchant {merchant_id}: CB-14, fourteen chargebacks in the last 7 days'


def in_content(wire: str) -> bool: return wire_format(wire).calls in IN_CONTENT


def backing(wire: str) -> FunctionLLM:
    """A scripted model: first a call to `merchant_profile`, then, once it has seen the result, the answer.

    It answers as a model would in each mode: native tool calls when it was sent tools (or, in JSON mode, when
    the server writes calls into the text, as a Qwen or Mistral model behind a server without a tool parser
    does), else the agent's JSON protocol. It always gives some reasoning; the wire format decides whether
    the client sees it.
    """
    def model(messages, tools=None, json_mode=False, **kw):
        seen = any('CB-14' in str(m.get('content') or '') for m in messages if m.get('role') in ('tool', 'user'))
        if seen and tools: return LLMResponse(content=ANSWER, reasoning=THINK_ANSWER)
        if seen: return LLMResponse(content=json.dumps({'thought': 'Done.', 'answer': ANSWER}), reasoning=THINK_ANSWER)
        if tools or in_content(wire): return LLMResponse(tool_calls=[CALL], reasoning=THINK_CALL)
        protocol = {'thought': 'Look it up.', 'action': {'tool': CALL.tool, 'args': CALL.args}}
        return LLMResponse(content=json.dumps(protocol), reasoning=THINK_CALL)
    return FunctionLLM(model, name=f'scripted-{wire}')


@pytest.fixture(scope='module', params=list(WIRES))
def served(request):
    "(wire name, server) for each wire format, one server per format."
    with ModelServer(backing(request.param), wire=request.param) as srv:
        yield request.param, srv


def client(srv) -> OpenAIChat: return OpenAIChat('scripted', base_url=srv.base_url, timeout=10, max_retries=0)


TOOLS = [{'type': 'function', 'function': {'name': 'merchant_profile', 'description': 'The chargeback profile.',
          'parameters': {'type': 'object', 'properties': {'merchant_id': {'type': 'string'}}, 'required': ['merchant_id']}}}]


def ask(llm, stream: bool, messages, **kw) -> LLMResponse:
    if not stream: return llm.chat(messages, **kw)
    items = list(llm.stream(messages, **kw))
    assert ''.join(items[:-1]) == items[-1].content
    return items[-1]


def view(r: LLMResponse) -> tuple:
    return r.content, [(c.tool, c.args) for c in r.tool_calls], r.reasoning, r.usage_estimated, r.finish_reason


# ---------------------------------------------------------------- what OpenAIChat reads, format by format

@pytest.mark.parametrize('stream', [False, True], ids=['chat', 'stream'])
def test_llm_reads_the_tool_call(served, stream):
    wire, srv = served
    r = ask(client(srv), stream, [{'role': 'user', 'content': QUESTION}], tools=TOOLS)
    w = wire_format(wire)
    if in_content(wire):  # the call comes back as text, exactly as the server wrote it, for the agent to read
        assert (r.tool_calls, r.finish_reason) == ([], 'stop')
        assert r.content == IN_CONTENT[w.calls]([CALL])
    else:
        assert [(c.tool, c.args) for c in r.tool_calls] == [(CALL.tool, CALL.args)] and r.finish_reason == 'tool_calls'
    assert r.reasoning == (THINK_CALL if wire == 'reasoning-content' else '')
    if wire == 'think': assert r.content == f'<think>\n{THINK_CALL}\n</think>\n\n'
    assert r.usage_estimated is (wire == 'no-usage')
    assert (r.reasoning_tokens > 0) == (wire == 'reasoning-content')  # reported when the reasoning has its field


@pytest.mark.parametrize('stream', [False, True], ids=['chat', 'stream'])
def test_llm_reads_the_answer(served, stream):
    wire, srv = served
    llm = client(srv)
    msgs = [{'role': 'user', 'content': QUESTION}, {'role': 'user', 'content': OUTPUT}]
    r = ask(llm, stream, msgs, json_mode=True)
    content = json.loads(r.content.split('</think>')[-1]) if wire == 'think' else json.loads(r.content)
    assert content == {'thought': 'Done.', 'answer': ANSWER}
    assert (r.reasoning, r.usage_estimated) == (THINK_ANSWER if wire == 'reasoning-content' else '', wire == 'no-usage')
    assert (llm.usage.llm_calls, llm.usage.estimated_calls) == (1, int(wire == 'no-usage'))
    assert llm.usage.reasoning_tokens == r.reasoning_tokens


def test_streamed_and_whole_answers_agree(served):
    wire, srv = served
    llm = client(srv)
    msgs = [{'role': 'user', 'content': QUESTION}]
    for kw in (dict(tools=TOOLS), dict(json_mode=True)):
        whole, streamed = ask(llm, False, msgs, **kw), ask(llm, True, msgs, **kw)
        assert view(streamed) == view(whole)
        assert (streamed.prompt_tokens, streamed.completion_tokens) == (whole.prompt_tokens, whole.completion_tokens)


@pytest.mark.parametrize('stream', [False, True], ids=['chat', 'stream'])
def test_broken_arguments_as_sent(stream):
    "Arguments a model broke arrive as `{'_raw': text}` in every native format, even the one that sends objects."
    broken = LLMResponse(tool_calls=[ToolCall(tool='merchant_profile', args={'_raw': '{"merchant_id": '})])
    for wire in ('openai', 'args-object'):
        with ModelServer(FunctionLLM(lambda m, **kw: broken), wire=wire) as srv:
            r = ask(client(srv), stream, [{'role': 'user', 'content': QUESTION}], tools=TOOLS)
        assert r.tool_calls[0].args == {'_raw': '{"merchant_id": '}, wire


# ---------------------------------------------------------------- the agent over each format

@pytest.mark.parametrize('stream', [False, True], ids=['chat', 'stream'])
@pytest.mark.parametrize('mode', ['json', 'native'])
def test_agent_runs_through(served, mode, stream):
    wire, srv = served
    agent = ReActAgent(client(srv), [merchant_profile], mode=mode, stream_tokens=stream, max_steps=4)
    run = agent.run(QUESTION)
    kinds = [g.kind for s in run.steps for g in s.safeguards]
    assert (run.stop_reason, run.answer) == ('answer', ANSWER), (wire, mode, kinds, [s.raw for s in run.steps])
    assert [[(c.tool, c.args) for c in s.actions] for s in run.steps] == [[(CALL.tool, CALL.args)], []]
    assert 'CB-14' in run.steps[0].observation and run.steps[0].observations[0].ok
    assert not {'correction', 'llm_error', 'internal_error'} & set(kinds), kinds


@pytest.mark.parametrize('mode', ['json', 'native'])
def test_agent_keeps_the_reasoning(served, mode):
    wire, srv = served
    run = ReActAgent(client(srv), [merchant_profile], mode=mode, max_steps=4).run(QUESTION)
    want = [THINK_CALL, THINK_ANSWER] if wire in REASONED else [None, None]
    assert [s.reasoning or None for s in run.steps] == want, (wire, mode)
    assert all('<think>' not in (s.answer or '') + (s.thought or '') for s in run.steps)


@pytest.mark.parametrize('mode', ['json', 'native'])
def test_agent_counts_estimated_usage_only_without_a_usage_block(served, mode):
    wire, srv = served
    run = ReActAgent(client(srv), [merchant_profile], mode=mode, max_steps=4).run(QUESTION)
    assert run.usage.llm_calls == 2
    assert run.usage.estimated_calls == (2 if wire == 'no-usage' else 0)
    assert [s.usage.estimated_calls for s in run.steps] == [int(wire == 'no-usage')] * 2
