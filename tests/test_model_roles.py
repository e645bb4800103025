"""Each architecture declares the roles its prompts ask a model to play (`model_roles`), and the simulated analyst
plays them by those declarations. Here every architecture answers the demo question with the analyst, every prompt
it sent is found in exactly the roles its own architecture declares (or in none: a ReAct conversation, or a pipeline
stage that asks for free text), and the declared roles the demo reaches are each asked for."""
from collections import Counter

import pytest

from reach_nb.agents.registry import AGENTS, ARCHITECTURES, make_agent, model_roles, role_in
from reach_nb.agents.router import AGENT_ROLES
from reach_nb.llm.models import ChatModel
from reach_nb.risk.agents import data_note, risk_tools
from reach_nb.risk.analysis import SPIKE_QUESTION
from reach_nb.risk.analyst import SimAnalyst
from reach_nb.risk.data import ensure_dataset
from reach_nb.risk.tools import RiskWorkspace


@pytest.fixture(scope='module')
def ws(tmp_path_factory):
    with RiskWorkspace(ensure_dataset(), store=tmp_path_factory.mktemp('ws')/'ws.sqlite') as w: yield w


class Recording(ChatModel):
    "The simulated analyst, keeping every prompt it is sent."
    def __init__(self):
        super().__init__('recording')
        self.inner, self.sent = SimAnalyst(), []
        self.meta = self.inner.meta
    def _complete(self, messages, tools, json_mode, temperature):
        self.sent.append(messages)
        return self.inner._complete(messages, tools, json_mode, temperature)


def allowed(arch:str) -> set:
    "The roles a prompt of `arch` may be in: its own, those of the agents a router hands to, or none where it has such prompts."
    own = {(arch, r) for r in ARCHITECTURES[arch].model_roles}
    if arch == 'router': own |= {(a, r) for a in AGENT_ROLES for r in ARCHITECTURES[a].model_roles} | {None}
    if arch in ('react', 'plan-execute', 'pipeline'): own |= {None}
    return own


@pytest.fixture(scope='module')
def asked(ws):
    "Per architecture: the role of each prompt it sent while answering the demo question, and the run."
    out = {}
    for arch in AGENTS:
        llm = Recording()
        run = make_agent(arch, llm, risk_tools(ws), data_note(ws)).run(SPIKE_QUESTION)
        out[arch] = ([role_in(p) for p in llm.sent], run)
    return out


@pytest.mark.parametrize('arch', AGENTS)
def test_every_prompt_is_in_a_role_its_architecture_declares(arch, asked):
    found, run = asked[arch]
    assert found and set(found) <= allowed(arch), (arch, Counter(found))
    if arch != 'chat': assert run.stop_reason == 'answer', run.stop_reason  # the analyst played every prompt


def test_no_prompt_is_in_two_roles():
    "The declarations do not overlap: a prompt written for one role matches no other."
    from reach_nb.agents import dag, plan_execute, pipeline, rewoo, router
    texts = {('plan-execute', 'planner'): plan_execute.PLANNER_SYSTEM, ('plan-execute', 'replanner'): plan_execute.REPLANNER_SYSTEM,
             ('plan-execute', 'solver'): plan_execute.SOLVER_SYSTEM, ('rewoo', 'planner'): rewoo.PLANNER_SYSTEM,
             ('rewoo', 'solver'): rewoo.SOLVER_SYSTEM, ('dag', 'planner'): dag.PLANNER_PROMPT, ('dag', 'join'): dag.JOIN_PROMPT,
             ('chat', 'chat'): router.CHAT_SYSTEM}
    for key, text in texts.items():
        prompt = [{'role': 'system', 'content': text}, {'role': 'user', 'content': 'Question: q'}]
        hits = [(a, r) for a, own in model_roles().items() for r, role in own.items() if role.asks(prompt)]
        assert hits == [key], (key, hits)


def test_every_declared_role_is_asked_for(asked, ws):
    "With the two settings the demo leaves out (the router asking its model, a plan replanned only on failure), every role is played."
    more = {}
    for arch, kw in (('router', {'ask_model': 'always'}), ('plan-execute', {'replan': 'on_failure'})):
        llm = Recording()
        run = make_agent(arch, llm, risk_tools(ws), data_note(ws), **kw).run(SPIKE_QUESTION)
        assert run.stop_reason == 'answer', (arch, kw, run.stop_reason)
        more[arch] = [role_in(p) for p in llm.sent]
        assert set(more[arch]) <= allowed(arch), (arch, Counter(more[arch]))
    seen = {x for found, _ in asked.values() for x in found} | {x for found in more.values() for x in found}
    declared = {(a, r) for a, own in model_roles().items() for r in own}
    assert declared <= seen, declared - seen
