"""The contract every architecture of the registry keeps, run over each of them (`AGENTS`): the same safeguards for a
model that cannot be reached, an error observation for a tool that raises, streamed tokens that add up to the
reply, the caller's labels on the run, resume when only the end was lost, a fork at any model step, and prompts
fitted to a model's context window."""
import functools
from collections import Counter

import pytest

from reach_nb.core import ModelOutput, Run, RunEnd, TokenDelta
from reach_nb.agents.kernel import rewired
from reach_nb.llm.models import REPLY_RESERVE, ChatModel, LLMError, count_tokens, message_text
from reach_nb.risk.tools import RiskWorkspace
from reach_nb.risk.data import ensure_dataset
from reach_nb.memory.sessions import SQLiteSessionStore, fork_run, record, resume
from reach_nb.agents.registry import AGENTS, make_agent
from reach_nb.risk.agents import data_note, risk_tools
from reach_nb.risk.analysis import SPIKE_QUESTION
from reach_nb.risk.analyst import SimAnalyst
from reach_nb.tools import ToolRegistry

TOOLED = [a for a in AGENTS if a != 'chat']


@pytest.fixture(scope='module')
def ws(tmp_path_factory):
    with RiskWorkspace(ensure_dataset(), store=tmp_path_factory.mktemp('ws')/'ws.sqlite') as w: yield w


def agent_of(arch:str, ws, llm=None, tools=None):
    return make_agent(arch, llm or SimAnalyst(), tools or risk_tools(ws), data_note(ws))


class Down(ChatModel):
    "A model whose server answers 503 to every call, after two retries."
    name = 'down'
    def _complete(self, *a): raise LLMError('503 Service Unavailable', status=503, retries=2)


@pytest.mark.parametrize('arch', AGENTS)
def test_a_model_that_cannot_be_reached(arch, ws):
    "Every architecture records the failed call the same way: `llm_error`, then `retry` with the retries made."
    run = agent_of(arch, ws, Down()).run(SPIKE_QUESTION)
    failed = [s for s in run.steps if any(g.kind == 'llm_error' for g in s.safeguards)]
    assert run.stop_reason == 'llm_error' and failed
    for s in failed:
        assert [g.kind for g in s.safeguards][:2] == ['llm_error', 'retry'], s.safeguards
        assert 'LLMError: 503 Service Unavailable' in s.safeguards[0].detail
        assert s.safeguards[1].detail.startswith('The model call was retried 2 times') and 'still failed' in s.safeguards[1].detail


def raising(fn):
    "`fn`'s signature and docs, but it raises."
    @functools.wraps(fn)
    def down(*a, **kw): raise RuntimeError('the analytics service is down')
    return down


@pytest.mark.parametrize('arch', TOOLED)
def test_a_raising_tool_is_an_error_observation(arch, ws):
    "A tool that raises never crashes a run: the call's observation says what failed, and a safeguard records it."
    tools = ToolRegistry([raising(f) for f in ws.tools()])
    run = agent_of(arch, ws, tools=tools).run(SPIKE_QUESTION)
    obs = [o for s in run.steps for o in s.observations if o.tool != '(agent)']
    ran = [o for o in obs if not o.content.startswith(('Not run', 'You already called'))]  # not refused or blocked
    assert run.stop_reason != 'error' and ran and not any(o.ok for o in obs)
    assert all(o.error == 'tool_error' and 'the analytics service is down' in o.content for o in ran)
    assert any(g.kind == 'tool_error' for s in run.steps for g in s.safeguards)


def streaming(agent):
    "`agent`, and the agents it hands questions to, with token streaming on."
    agent.stream_tokens = True
    for a in getattr(agent, 'agents', {}).values(): streaming(a)
    return agent


@pytest.mark.parametrize('arch', AGENTS)
def test_streamed_tokens_add_up_to_each_reply(arch, ws):
    events = list(streaming(agent_of(arch, ws)).stream(SPIKE_QUESTION))
    said = {e.index: e.raw for e in events if isinstance(e, ModelOutput)}
    tokens = {}
    for e in events:
        if isinstance(e, TokenDelta): tokens[e.index] = tokens.get(e.index, '') + e.text
    assert tokens and tokens == {i: said[i] for i in tokens}, 'tokens that do not make the reply'
    assert set(said) <= set(tokens) | {i for i in said if not said[i]}, 'a reply that did not stream'
    assert Run.from_events(events).stop_reason == 'answer'


@pytest.mark.parametrize('arch', AGENTS)
def test_labels_given_to_stream_are_on_the_run(arch, ws):
    run = Run.from_events(agent_of(arch, ws).stream(SPIKE_QUESTION, meta={'run_id': 'r-1', 'user': 'ana'}))
    assert (run.meta['run_id'], run.meta['user'], run.stop_reason) == ('r-1', 'ana', 'answer')


class Counted(ChatModel):
    "A model that counts its calls."
    def __init__(self, inner): super().__init__(inner.name); self.inner, self.n, self.meta = inner, 0, inner.meta
    def _complete(self, messages, tools, json_mode, temperature):
        self.n += 1
        return self.inner._complete(messages, tools, json_mode, temperature)


@pytest.mark.parametrize('arch', AGENTS)
def test_resume_when_only_the_end_was_lost(arch, ws, tmp_path):
    "A run whose process died after its last step is finished from the store without asking the model again."
    with SQLiteSessionStore(tmp_path/'s.sqlite') as store:
        whole = record(store, agent_of(arch, ws), SPIKE_QUESTION, 's')
        run_id, events = whole.meta['run_id'], store.events(whole.meta['run_id'])
        cut = store.new_run('s', question=SPIKE_QUESTION)
        for e in events:
            if not isinstance(e, RunEnd): store.append(cut, e)
        llm = Counted(SimAnalyst())
        again = resume(store, cut, agent_of(arch, ws, llm))
    assert (again.answer, again.stop_reason, llm.n) == (whole.answer, 'answer', 0)
    assert again.usage.llm_calls == whole.usage.llm_calls


@pytest.mark.parametrize('arch', AGENTS)
def test_fork_at_a_model_step(arch, ws, tmp_path):
    "A fork at the run's last model step, given the reply it had, ends as the run did; the earlier steps are not redone."
    with SQLiteSessionStore(tmp_path/'s.sqlite') as store:
        whole = record(store, agent_of(arch, ws), SPIKE_QUESTION, 's')
        last = max(s.index for s in whole.steps if s.usage.llm_calls)
        llm = Counted(SimAnalyst())
        forked = fork_run(store, whole.meta['run_id'], last, agent_of(arch, ws, llm),
                          model_output=next(s.raw for s in whole.steps if s.index == last))
    assert (forked.answer, forked.stop_reason, llm.n) == (whole.answer, 'answer', 0)
    assert (forked.meta['fork_step'], forked.meta['parent']) == (last, whole.meta['run_id'])
    assert [s.index for s in forked.steps] == [s.index for s in whole.steps]


class Garbled(ChatModel):
    "A model that never writes anything readable."
    name = 'garbled'
    def _complete(self, *a):
        from reach_nb.llm.models import LLMResponse
        return LLMResponse(content='Let me think about the channels first...')


class Fenced(ChatModel):
    "The offline analyst, with every reply wrapped in a json code fence, as small models often write."
    def __init__(self): super().__init__('fenced'); self.inner, self.meta = SimAnalyst(), SimAnalyst().meta
    def _complete(self, messages, tools, json_mode, temperature):
        r = self.inner._complete(messages, tools, json_mode, temperature)
        return r.model_copy(update={'content': f"```json\n{r.content}\n```"})


SWITCHED = ['react', 'plan-execute', 'rewoo', 'dag', 'pipeline']


@pytest.mark.parametrize('arch', SWITCHED)
def test_the_correction_round_can_be_switched_off(arch, ws):
    "With the correction round off, the first unreadable reply ends the run; with it on, the model is asked again."
    on = agent_of(arch, ws, Garbled()).run(SPIKE_QUESTION)
    off = make_agent(arch, Garbled(), risk_tools(ws), data_note(ws), safeguards={'correction': False}).run(SPIKE_QUESTION)
    tried = lambda run: sum(s.parse_level == 'failed' and s.usage.llm_calls for s in run.steps)  # unreadable replies
    assert (on.stop_reason, off.stop_reason) == ('parse_failures', 'parse_failures')
    assert tried(off) == 1 < tried(on), (tried(off), tried(on))
    assert off.meta['safeguards_off'] == ['correction'] and 'safeguards_off' not in on.meta


@pytest.mark.parametrize('arch', ['react', 'plan-execute', 'dag', 'pipeline'])
def test_tolerant_parsing_can_be_switched_off(arch, ws):
    "Fenced JSON is read with tolerant parsing on; with it off, such a reply is a failed one."
    on = agent_of(arch, ws, Fenced()).run(SPIKE_QUESTION)
    off = make_agent(arch, Fenced(), risk_tools(ws), data_note(ws), safeguards={'tolerant_parsing': False}).run(SPIKE_QUESTION)
    assert on.stop_reason == 'answer' and off.stop_reason == 'parse_failures', (on.stop_reason, off.stop_reason)
    assert any(s.parse_level == 'repaired' for s in on.steps) and all(s.parse_level != 'repaired' for s in off.steps)


@pytest.mark.parametrize('arch', TOOLED)
def test_a_cancelled_run_stops_and_is_stored_finished(arch, ws, tmp_path):
    "Cancelled after its first step, a run stops there, asks the model nothing more, and is stored with 'stopped'."
    import threading
    stop, llm = threading.Event(), Counted(SimAnalyst())
    def on_event(e):
        if e.type == 'step_end': stop.set()
    with SQLiteSessionStore(tmp_path/'s.sqlite') as store:
        run = record(store, agent_of(arch, ws, llm), SPIKE_QUESTION, 's', on_event=on_event, cancel=stop)
        info = store.info(run.meta['run_id'])
    assert (run.stop_reason, info.status, len(run.steps), llm.n) == ('stopped', 'finished', 1, 1)


class Windowed(ChatModel):
    "The simulated analyst behind a context window of `window` tokens; what it is sent is kept."
    def __init__(self, window:int|None=None):
        super().__init__('windowed')
        self.inner = SimAnalyst()
        self.sent = []
        self.context_window = window

    def _complete(self, messages, tools, json_mode, temperature):
        self.sent.append(messages)
        return self.inner.chat(messages, tools=tools, json_mode=json_mode, temperature=temperature)


def tokens(messages): return sum(count_tokens(message_text(m)) + 4 for m in messages)


@pytest.mark.parametrize('arch', AGENTS)
def test_a_prompt_past_the_context_window_is_fitted_or_refused(arch, ws):
    """With a window a fifth smaller than its longest prompt, no architecture sends a prompt past it: each is fitted
    (a `size_cap` safeguard, the step's prompt as sent) or, when its system prompt alone is over, the call fails as an
    `llm_error` that names the window."""
    whole = Windowed()
    agent_of(arch, ws, whole).run(SPIKE_QUESTION)
    window = int(0.8 * max(map(tokens, whole.sent)) * Windowed.token_scale) + REPLY_RESERVE
    small = Windowed(window)
    run = agent_of(arch, ws, small).run(SPIKE_QUESTION)
    budget = (window - REPLY_RESERVE) / small.token_scale
    assert all(tokens(m) <= budget for m in small.sent)
    kinds = [(s, g) for s in run.steps for g in s.safeguards]
    fitted = [s for s, g in kinds if g.kind == 'size_cap' and "model's context window" in g.detail]
    refused = [g for s, g in kinds if g.kind == 'llm_error' and 'context window' in g.detail]
    assert fitted or refused, [g for _, g in kinds]
    assert all(s.prompt in small.sent for s in fitted)
    system_over = any(m[0].get('role') == 'system' and tokens(m[:1]) > budget for m in whole.sent if m)
    assert system_over or not refused  # a refusal only where nothing but cutting the system prompt would do
    assert not any(g.kind == 'internal_error' for _, g in kinds)
