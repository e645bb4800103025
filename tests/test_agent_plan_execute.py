"""PlanExecuteAgent with scripted models: the plan runs in order, a failure is replanned once and the revision runs,
the revision bound holds, a goal-only step is a ReAct sub-run inside the run, a malformed plan is corrected, traces
keep their plans, the model calls are what the architecture promises; and the same over real HTTP."""
import json

import pytest

from reach_nb.core import Run, read_trace, write_trace
from reach_nb.llm.models import LLMError, OpenAIChat, ScriptedLLM
from reach_nb.llm.server import ModelServer
from reach_nb.agents.plan_execute import PlanExecuteAgent
from reach_nb.agents.react import ReActAgent
from reach_nb.tools import ToolRegistry

RATES, ACCOUNTS = {'c09': '31%', 'c01': '4%', 'c07': '2%'}, {'c09': 212, 'c01': 1840, 'c07': 960}


@pytest.fixture
def tools():
    "Three tools over payment channels, and the list of calls they received, in order."
    asked = []
    def refund_rates():
        "Refund rate of every payment channel, highest first."
        asked.append('refund_rates()'); return '\n'.join(f'{c}: {r}' for c, r in RATES.items())
    def refund_rate(channel: str):  # a payment channel id
        "Refund rate of one payment channel."
        asked.append(f'refund_rate({channel})'); return f'{channel}: {RATES[channel]}'
    def accounts(channel: str):  # a payment channel id
        "How many accounts paid through a payment channel."
        asked.append(f'accounts({channel})'); return f'{ACCOUNTS[channel]} accounts paid through {channel}.'
    return ToolRegistry([refund_rates, refund_rate, accounts]), asked


def task(id, goal, tool=None, **args): return {'id': id, 'goal': goal, **({'tool': tool, 'args': args} if tool else {})}
def planned(*steps, thought='Find the figures.'): return json.dumps({'thought': thought, 'plan': list(steps)})
def decided(decision, reason='', plan=None, answer=None):
    return json.dumps({'decision': decision, 'reason': reason, 'plan': plan or [], 'answer': answer})
def said(thought, tool=None, answer=None, **args):
    if tool is None: return json.dumps({'thought': thought, 'answer': answer})
    return json.dumps({'thought': thought, 'action': {'tool': tool, 'args': args}})


ROLES = {'You plan how': 'planner', 'You check a plan': 'replanner', 'You write the final answer': 'solver',
         'You are an analyst agent': 'executor'}

def roles(llm: ScriptedLLM) -> list[str]:
    "Which role each model call played, read from its system prompt."
    return [next(r for k, r in ROLES.items() if c['messages'][0]['content'].startswith(k)) for c in llm.calls]


Q3 = 'How do the refund rates of c01 and c09 compare, and how many accounts paid through c09?'
PLAN3 = planned(task('s1', 'Refund rate of c01', 'refund_rate', channel='c01'),
                task('s2', 'Refund rate of c09', 'refund_rate', channel='c09'),
                task('s3', 'Accounts on c09', 'accounts', channel='c09'))
ANSWER3 = 'c09 refunds 31% against 4% for c01; 212 accounts paid through c09.'
RATES_TEXT = 'c09: 31%\nc01: 4%\nc07: 2%'


def test_a_plan_of_three_steps_runs_in_order_with_its_tool_calls(tools):
    reg, asked = tools
    llm = ScriptedLLM([PLAN3, decided('keep'), decided('keep'), decided('finish', 'All found.', answer=ANSWER3)])
    run = PlanExecuteAgent(llm, reg).run(Q3)
    assert (run.answer, run.stop_reason) == (ANSWER3, 'answer')
    assert asked == ['refund_rate(c01)', 'refund_rate(c09)', 'accounts(c09)']
    work = [s for s in run.steps if s.task]
    assert [(s.task, str(s.action), s.observation) for s in work] == [
        ('s1', "refund_rate(channel='c01')", 'c01: 4%'), ('s2', "refund_rate(channel='c09')", 'c09: 31%'),
        ('s3', "accounts(channel='c09')", '212 accounts paid through c09.')]
    assert roles(llm) == ['planner', 'replanner', 'replanner', 'replanner']
    assert 'c09: 31%' in llm.calls[3]['messages'][1]['content']  # the last replanner saw every result
    assert [s.index for s in run.steps] == list(range(1, 8))
    assert run.meta['architecture'] == 'plan-execute' and [p.version for p in run.plans] == [1]


def test_an_earlier_result_fills_a_later_steps_arguments(tools):
    reg, asked = tools
    llm = ScriptedLLM([planned(task('s1', 'Top channel', 'refund_rate', channel='c09'),
                               task('s2', 'Its accounts', 'accounts', channel='{s1}')),
                       decided('keep'), decided('finish', answer='done')])
    PlanExecuteAgent(llm, reg).run('q')
    assert asked == ['refund_rate(c09)', 'accounts(c09: 31%)']  # {s1} was replaced by s1's result before the call


@pytest.mark.parametrize('replan, script_tail, calls', [
    ('on_failure', [said('From the results.', answer='c09: 31%, 212 accounts.')], ['planner', 'replanner', 'solver']),
    ('always', [decided('keep', 'Rate found.'), decided('finish', answer='c09: 31%, 212 accounts.')],
     ['planner', 'replanner', 'replanner', 'replanner'])])
def test_a_failed_step_triggers_one_replan_and_the_revised_plan_runs(tools, replan, script_tail, calls):
    reg, asked = tools
    revised = [task('s3', 'Rate of c09', 'refund_rate', channel='c09'),
               task('s2', 'Accounts', 'accounts', channel='c09')]
    llm = ScriptedLLM([planned(task('s1', 'Rate of c09', 'refund_rate', channel='c9'), revised[1]),
                       decided('revise', 'c9 is not a channel id; use c09.', plan=revised), *script_tail])
    run = PlanExecuteAgent(llm, reg, replan=replan).run('Refund rate of c09, and its accounts?')
    assert (run.answer, run.stop_reason) == ('c09: 31%, 212 accounts.', 'answer')
    assert asked == ['refund_rate(c9)', 'refund_rate(c09)', 'accounts(c09)']
    assert [(p.version, [t.id for t in p.tasks]) for p in run.plans] == [(1, ['s1', 's2']), (2, ['s3', 's2'])]
    assert run.plans[1].note == 'c9 is not a channel id; use c09.'
    assert roles(llm) == calls
    failed = next(s for s in run.steps if s.task == 's1')
    assert not failed.observations[0].ok and [g.kind for g in failed.safeguards] == ['tool_error']
    assert "raised KeyError: 'c9'" in llm.calls[1]['messages'][1]['content']  # the replanner saw the failure


@pytest.mark.parametrize('max_replans', [0, 1, 3])
def test_the_bound_on_replans_is_respected(tools, max_replans):
    reg, asked = tools
    again = lambda k: decided('revise', f'Try again ({k}).', plan=[task(f'r{k}', 'Rate', 'refund_rate', channel='c9')])
    llm = ScriptedLLM([planned(task('s1', 'Rate', 'refund_rate', channel='c9')),
                       *[again(k) for k in range(1, max_replans + 2)], said('None found.', answer='No rate for c9.')])
    run = PlanExecuteAgent(llm, reg, max_replans=max_replans).run('Refund rate of c9?')
    assert [p.version for p in run.plans] == list(range(1, max_replans + 2))
    assert asked == ['refund_rate(c9)'] * (max_replans + 1)  # the refused revision never ran
    assert (run.answer, run.stop_reason) == ('No rate for c9.', 'max_steps')
    assert roles(llm) == ['planner'] + ['replanner'] * (max_replans + 1) + ['solver']
    assert [g.kind for g in run.steps[-1].safeguards] == ['max_steps']


def test_the_bound_without_a_usable_solver_reply_ends_with_what_the_tools_found(tools):
    reg, asked = tools
    llm = ScriptedLLM([planned(task('s1', 'Rates', 'refund_rates')),
                       decided('revise', plan=[task('s2', 'Rate', 'refund_rate', channel='c09')])])
    run = PlanExecuteAgent(llm, reg, max_replans=0).run('Which channel?')
    assert run.stop_reason == 'llm_error'
    assert run.answer.startswith('No conclusion was reached. What the tools returned:')
    assert 'c09: 31%' in run.answer and asked == ['refund_rates()']


def test_a_goal_only_step_is_a_react_sub_run_tagged_with_its_task(tools):
    reg, asked = tools
    llm = ScriptedLLM([planned(task('s1', 'All refund rates', 'refund_rates'),
                               task('s2', 'Count the accounts on the channel with the highest refund rate')),
                       decided('keep', 'Rates found.'),
                       said('c09 is highest.', 'accounts', channel='c09'), said('Counted.', answer='212 on c09.'),
                       decided('finish', answer='c09 (31%), 212 accounts.')])
    run = PlanExecuteAgent(llm, reg, executor_steps=3).run('Which channel refunds most, and how many accounts use it?')
    assert (run.answer, asked) == ('c09 (31%), 212 accounts.', ['refund_rates()', 'accounts(c09)'])
    assert roles(llm) == ['planner', 'replanner', 'executor', 'executor', 'replanner']
    assert [(s.index, s.task) for s in run.steps] == [(1, None), (2, 's1'), (3, None), (4, 's2'), (5, 's2'), (6, None)]
    sub = [s for s in run.steps if s.task == 's2']
    assert [s.usage.llm_calls for s in sub] == [1, 1]
    assert (sub[0].action.tool, sub[1].answer) == ('accounts', '212 on c09.')
    assert [s.prompt for s in sub] == [llm.calls[2]['messages'], llm.calls[3]['messages']]
    helper = llm.calls[2]['messages']
    assert 'c09: 31%' in helper[0]['content'] and helper[1]['content'].startswith('Count the accounts')
    ends = [(e.task, e.index, e.ok, e.result) for e in run.extra if e.type == 'task_end']
    assert ends == [('s1', 2, True, RATES_TEXT), ('s2', 4, True, '212 on c09.')]
    assert run.usage.llm_calls == 5 and run.usage.tool_calls == 2



def test_a_failed_sub_run_is_a_failed_step_and_goes_to_the_replanner(tools):
    reg, _ = tools
    llm = ScriptedLLM([planned(task('s1', 'Find the top channel')),
                       'not json', 'still not', 'never',  # the helper agent's three tries: it gives up
                       said('Nothing found.', answer='Unknown.')])
    run = PlanExecuteAgent(llm, reg, replan='on_failure', max_corrections=2).run('Top channel?')
    end = next(e for e in run.extra if e.type == 'task_end')
    assert (end.task, end.ok) == ('s1', False)
    assert roles(llm)[:4] == ['planner', 'executor', 'executor', 'executor']


def test_a_malformed_plan_is_corrected_through_a_correction_round(tools):
    reg, asked = tools
    llm = ScriptedLLM(['Sure! First I will look at the rates.',
                       planned(task('s1', 'Rates', 'refund_rate_all')),
                       planned(task('s1', 'Rates', 'refund_rates')), decided('finish', answer='c09.')])
    run = PlanExecuteAgent(llm, reg).run('Which channel refunds most?')
    assert (run.answer, asked) == ('c09.', ['refund_rates()'])
    assert [s.parse_level for s in run.steps[:3]] == ['failed', 'failed', 'strict']
    assert [[g.kind for g in s.safeguards] for s in run.steps[:2]] == [['correction'], ['correction']]
    fix1, fix2 = llm.calls[1]['messages'][-1]['content'], llm.calls[2]['messages'][-1]['content']
    assert fix1.startswith('Your last reply could not be used.') and '"plan"' in fix1
    assert "unknown tool 'refund_rate_all'" in fix2
    assert run.plans[0].index == 3 and [t.id for t in run.plans[0].tasks] == ['s1']


def test_a_plan_that_cannot_be_corrected_ends_the_run_without_an_exception(tools):
    reg, asked = tools
    run = PlanExecuteAgent(ScriptedLLM(['no'] * 3), reg).run('q')
    assert (run.stop_reason, asked, run.plans, run.usage.llm_calls) == ('parse_failures', [], [], 3)


def test_an_unreadable_replanner_leaves_the_plan_as_it_is(tools):
    reg, asked = tools
    llm = ScriptedLLM([PLAN3, '?', '??', '???', decided('keep'), decided('finish', answer='ok')])
    run = PlanExecuteAgent(llm, reg).run(Q3)
    assert (run.answer, asked) == ('ok', ['refund_rate(c01)', 'refund_rate(c09)', 'accounts(c09)'])


def test_a_model_that_fails_mid_run_stops_with_llm_error_and_what_the_tools_found(tools):
    reg, _ = tools
    run = PlanExecuteAgent(ScriptedLLM([PLAN3]), reg).run(Q3)  # the replanner's call finds the script exhausted
    assert run.stop_reason == 'llm_error' and 'c01: 4%' in run.answer
    assert [g.kind for g in run.steps[-1].safeguards] == ['llm_error']


def test_a_trace_saves_and_loads_with_its_plans(tools, tmp_path):
    reg, _ = tools
    revised = [task('s3', 'Rate of c09', 'refund_rate', channel='c09'), task('s4', 'Count on the top channel')]
    script = [planned(task('s1', 'Rate', 'refund_rate', channel='c9'),
                      task('s2', 'Accounts', 'accounts', channel='c09')),
              decided('revise', 'Wrong id.', plan=revised), decided('keep'),
              said('Count.', 'accounts', channel='c09'), said('Done.', answer='212.'),
              decided('finish', answer='c09, 212.')]
    live = write_trace(PlanExecuteAgent(ScriptedLLM(script), reg).stream('q'), tmp_path / 'live.jsonl')
    run = Run.load(live)
    saved = Run.load(run.save(tmp_path / 'saved.jsonl'))
    for r in (run, saved):
        assert (r.answer, r.stop_reason, r.status) == ('c09, 212.', 'answer', 'finished')
        assert [(p.version, [t.id for t in p.tasks], p.note) for p in r.plans] == [
            (1, ['s1', 's2'], 'Find the figures.'), (2, ['s3', 's4'], 'Wrong id.')]
        assert r.plans[1].tasks[0].call.args == {'channel': 'c09'} and r.plans[1].tasks[1].call is None
        assert [s.task for s in r.steps] == [None, 's1', None, 's3', None, 's4', 's4', None]
        assert [e.task for e in r.extra if e.type == 'task_end'] == ['s1', 's3', 's4']
    assert saved.model_dump(exclude={'usage'}) == run.model_dump(exclude={'usage'})
    assert [e.type for e in read_trace(live)].count('plan') == 2


def test_model_calls_planner_replanner_per_step_solver_against_react(tools):
    reg, _ = tools
    react = ReActAgent(ScriptedLLM([said('c01.', 'refund_rate', channel='c01'),
                                    said('c09.', 'refund_rate', channel='c09'),
                                    said('Accounts.', 'accounts', channel='c09'), said('Done.', answer=ANSWER3)]), reg)
    always = PlanExecuteAgent(ScriptedLLM([PLAN3, decided('keep'), decided('keep'), decided('keep'),
                                           said('From the results.', answer=ANSWER3)]), reg)
    on_failure = PlanExecuteAgent(ScriptedLLM([PLAN3, said('From the results.', answer=ANSWER3)]), reg,
                                  replan='on_failure')
    got = {k: a.run(Q3) for k, a in {'react': react, 'always': always, 'on_failure': on_failure}.items()}
    assert {k: r.answer for k, r in got.items()} == dict.fromkeys(got, ANSWER3)
    # ReAct: one call per tool call and one for the answer; replan always: planner + a replanner per step (+ the
    # solver when no replanner finished); on failure: planner + solver, whatever the number of steps.
    assert {k: r.usage.llm_calls for k, r in got.items()} == {'react': 4, 'always': 5, 'on_failure': 2}
    assert got['on_failure'].usage.prompt_tokens < got['react'].usage.prompt_tokens / 2
    assert all(r.usage.tool_calls == 3 for r in got.values())


def test_over_http_with_the_openai_client(tools):
    reg, asked = tools
    backing = ScriptedLLM([planned(task('s1', 'All refund rates', 'refund_rates'),
                                   task('s2', 'Accounts on the top one')),
                           said('c09.', 'accounts', channel='c09'), said('Counted.', answer='212 on c09.'),
                           said('From the results.', answer='c09, 212 accounts.')])
    with ModelServer(backing) as srv:
        llm = OpenAIChat('test-model', base_url=srv.base_url, timeout=5, max_retries=1)
        run = PlanExecuteAgent(llm, reg, replan='on_failure').run('Top channel and its accounts?')
        sent = srv.app.state.requests
    assert (run.answer, run.stop_reason, asked) == ('c09, 212 accounts.', 'answer', ['refund_rates()', 'accounts(c09)'])
    assert [s.task for s in run.steps] == [None, 's1', 's2', 's2', None]
    assert len(sent) == 4 and all('response_format' in r for r in sent)  # every role asked for JSON
    assert run.model == 'test-model' and run.usage.llm_calls == 4


def test_a_question_that_is_not_text_is_refused(tools):
    with pytest.raises(TypeError, match='must be a str'): PlanExecuteAgent(ScriptedLLM([]), tools[0]).stream(3)
