"""Asking the user, in every architecture that plans and in the stage pipeline: a plan's task that calls `ask_user` ends the run at the end of
its step with `needs_input` and the question; `reply_events` carries the run on with the user's reply as that
call's result, the steps before played back (the model is asked only what comes after), the other calls' results
kept."""
import json

import pytest

from reach_nb.core import Run
from reach_nb.agents.dag import DAGAgent
from reach_nb.agents.kernel import reply_events
from reach_nb.llm.models import ScriptedLLM
from reach_nb.agents.pipeline import PipelineAgent
from reach_nb.agents.plan_execute import PlanExecuteAgent
from reach_nb.agents.registry import example_pipeline
from reach_nb.agents.react import ReActAgent
from reach_nb.agents.rewoo import ReWOOAgent

ran = []


def lookup(key:str): # what to look up
    "Look a key up."
    ran.append(key)
    return f'value of {key}'


ASKS = {  # architecture: (its class, the replies up to the question, the replies after the user's reply)
    'react': (ReActAgent, [json.dumps({'thought': 'Ask.', 'actions': [
        {'tool': 'lookup', 'args': {'key': 'x'}}, {'tool': 'ask_user', 'args': {'question': 'Which week?'}}]})],
              [json.dumps({'thought': 'Done.', 'answer': 'Done: the last one'})]),
    'plan-execute': (PlanExecuteAgent, [json.dumps({'thought': 'Look, then ask.', 'plan': [
        {'id': 's1', 'goal': 'x', 'tool': 'lookup', 'args': {'key': 'x'}},
        {'id': 's2', 'goal': 'which week', 'tool': 'ask_user', 'args': {'question': 'Which week?'}}]}),
        json.dumps({'decision': 'keep', 'reason': 'Go on.'})],
                     [json.dumps({'decision': 'finish', 'reason': 'Known.', 'answer': 'Done: the last one'})]),
    'rewoo': (ReWOOAgent, ['Plan: look, and ask.\n#E1 = lookup[x]\nPlan: ask.\n#E2 = ask_user[Which week?]'],
              ['Done: the last one']),
    'dag': (DAGAgent, [json.dumps({'thought': 'Both at once.', 'plan': [
        {'id': 't1', 'tool': 'lookup', 'args': {'key': 'x'}},
        {'id': 't2', 'tool': 'ask_user', 'args': {'question': 'Which week?'}}]})],
            [json.dumps({'thought': 'All in.', 'decision': 'answer', 'answer': 'Done: the last one'})]),
}


@pytest.mark.parametrize('arch', ASKS)
def test_a_question_to_the_user_pauses_the_run_and_a_reply_carries_it_on(arch):
    cls, before, after = ASKS[arch]
    ran.clear()
    run = Run.from_events(cls(ScriptedLLM(before), [lookup], ask_user=True).stream('What changed?'))
    assert (run.stop_reason, run.answer, ran) == ('needs_input', 'Which week?', ['x'])
    llm = ScriptedLLM(after)  # only what comes after the reply is asked for
    went_on = Run.from_events(reply_events(cls(llm, [lookup], ask_user=True), run, 'the last one'))
    assert (went_on.stop_reason, went_on.answer, ran) == ('answer', 'Done: the last one', ['x'])  # x not run again
    assert len(llm.calls) == len(after) and 'the last one' in json.dumps(llm.calls[0]['messages'])
    assert went_on.meta['replied_step'] == run.steps[-1].index



def test_a_pipeline_stage_that_asks_pauses_the_run_and_a_reply_carries_it_on():
    "The act stage calls `ask_user` in the second round: the run waits; the reply is that call's result."
    act = lambda tool, args: json.dumps({'thought': 'Go.', 'action': {'tool': tool, 'args': args}})
    before = ['Look x up first.', act('lookup', {'key': 'x'}),
              '{"summary": "x is known.", "heartbeat": "Asking which week."}',
              'Ask which week.', act('ask_user', {'question': 'Which week?'})]
    ran.clear()
    agent = lambda llm: PipelineAgent(llm, [lookup], example_pipeline(), ask_user=True)
    run = Run.from_events(agent(ScriptedLLM(before)).stream('What changed?'))
    assert (run.stop_reason, run.answer, ran) == ('needs_input', 'Which week?', ['x'])
    llm = ScriptedLLM(['{"summary": "x, in the last week.", "final_answer": "Done: the last one"}'])
    went_on = Run.from_events(reply_events(agent(llm), run, 'the last one'))
    assert (went_on.stop_reason, went_on.answer, ran) == ('answer', 'Done: the last one', ['x'])
    assert len(llm.calls) == 1 and 'the last one' in json.dumps(llm.calls[0]['messages'])
    assert went_on.meta['replied_step'] == run.steps[-1].index

def test_a_run_that_does_not_wait_is_refused():
    run = Run.from_events(DAGAgent(ScriptedLLM(ASKS['dag'][1][:0] + [json.dumps({'thought': 't', 'plan': [
        {'id': 't1', 'tool': 'lookup', 'args': {'key': 'x'}}]}), ASKS['dag'][2][0]]), [lookup]).stream('q'))
    with pytest.raises(ValueError, match='not waiting for the user'): reply_events(DAGAgent(ScriptedLLM([]), [lookup]), run, 'x')
