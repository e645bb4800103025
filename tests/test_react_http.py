"""The ReAct agent in native function-calling mode against the local OpenAI-compatible server, over real HTTP with the
real `openai` client: servers that write tool calls into the content (Hermes tags, Mistral's [TOOL_CALLS], Llama's
<|python_tag|>, a bare JSON call), reasoning in a <think> block or a field of its own, retries after a 429 or a
malformed body, and no usage block. Nothing is patched; the backing model is scripted."""
import pytest

from reach_nb.core import ToolCall
from reach_nb.llm.models import LLMResponse, OpenAIChat, ScriptedLLM
from reach_nb.llm.server import ModelServer
from reach_nb.agents.react import ReActAgent
from reach_nb.tools import tool


@tool
def search(query: str,  # what to look for
           limit: int = 3):  # how many hits at most
    "Search the risk knowledge base."
    return 'Proxy recharge: 3 devices paid for 212 accounts.' if 'proxy' in query else f'No entry matches {query!r}.'


def scripted():
    "A native model: one call, then the answer (how the server writes them is up to its wire format)."
    return ScriptedLLM([LLMResponse(tool_calls=[ToolCall(tool='search', args={'query': 'proxy recharge'})]),
                        LLMResponse(content='A proxy-recharge ring: 3 devices, 212 accounts.')])


def ask(wire, **server_kw):
    with ModelServer(scripted(), wire=wire, **server_kw) as srv:
        llm = OpenAIChat('test-model', base_url=srv.base_url, timeout=5, max_retries=2)
        return ReActAgent(llm, [search], mode='native').run('Is there proxy recharge?')


@pytest.mark.parametrize('wire, repair', [('hermes', 'hermes_tool_call'), ('mistral', 'mistral_tool_calls'),
                                          ('llama', 'llama_python_tag'), ('bare-json', 'bare_json_call')])
def test_calls_written_in_the_content_are_run(wire, repair):
    run = ask(wire)
    s = run.steps[0]
    assert (run.stop_reason, run.answer) == ('answer', 'A proxy-recharge ring: 3 devices, 212 accounts.')
    assert (s.action.tool, s.action.args) == ('search', {'query': 'proxy recharge'})
    assert (s.parse_level, s.repairs[0]) == ('repaired', repair)
    assert [g.kind for g in s.safeguards] == ['repair'] and s.observation.startswith('Proxy recharge')


def test_native_calls_with_a_think_block_keep_the_reasoning_apart():
    run = ask('openai+think')
    assert [s.parse_level for s in run.steps] == ['native', 'native']
    assert run.steps[0].reasoning and '<think>' not in run.answer and run.answer.startswith('A proxy-recharge ring')


def test_reasoning_in_its_own_field_and_its_tokens():
    run = ask('hermes+reasoning-content')
    assert run.steps[0].action.tool == 'search' and run.steps[0].reasoning
    assert run.usage.reasoning_tokens > 0 and run.usage.estimated_calls == 0


def test_no_usage_block_counts_as_estimated_and_retries_are_a_safeguard():
    run = ask('no-usage', errors=[429], retry_after=0.01)
    assert (run.stop_reason, run.usage.llm_calls, run.usage.estimated_calls) == ('answer', 2, 2)
    assert [g.kind for g in run.steps[0].safeguards] == ['retry'] and run.steps[1].safeguards == []


def test_a_malformed_body_is_retried_and_the_step_says_so():
    run = ask('openai', malformed=1)
    retry = run.steps[0].safeguards
    assert (run.stop_reason, run.answer) == ('answer', 'A proxy-recharge ring: 3 devices, 212 accounts.')
    assert [(g.kind, g.detail) for g in retry] == [
        ('retry', 'The model call was retried 1 time (after a malformed response body).')]
    assert run.steps[1].safeguards == [] and run.usage.llm_calls == 2


def test_malformed_bodies_past_max_retries_end_the_step_as_an_llm_error():
    run = ask('openai', malformed=3)
    kinds = [g.kind for g in run.steps[0].safeguards]
    assert (run.stop_reason, kinds) == ('llm_error', ['llm_error', 'retry'])
    assert run.steps[0].safeguards[1].detail == ('The model call was retried 2 times (after a malformed response '
                                                 'body). It still failed.')
