"""The stage pipeline agent, driven by its YAML file: what each stage's model call is sent (prompt, temperature,
JSON mode, tools) follows the file; a stage added to the file is an extra call; the iteration cap ends a loop that
never finishes; a heartbeat does not end the loop; the user, flow and error channels stay apart; and each mistake
in the file is one error naming the file and the problem, found before any model call. The models are scripted
and record every call; one test goes over real HTTP to the local model server with the real `openai` client."""
import os, shutil
from pathlib import Path

import pytest
import yaml

from reach_nb.core import Run, UserError
from reach_nb.llm.models import FunctionLLM, OpenAIChat, ScriptedLLM
from reach_nb.llm.server import ModelServer
from reach_nb.agents.pipeline import FINAL_FORMAT, TOOL_FORMAT, PipelineAgent, channels, load_pipeline
from reach_nb.tools import ToolRegistry

EXAMPLE = Path(__file__).resolve().parents[1] / 'data' / 'pipelines'
QUESTION = 'How densely populated is Paris?'


def population(city: str):  # a city's name
    "The population of a city, in millions."
    return {'paris': '2.1', 'lyon': '0.5'}.get(city.lower(), f'No figure for {city}.')


def area(city: str):  # a city's name
    "The area of a city, in square kilometres."
    return {'paris': '105', 'lyon': '48'}.get(city.lower(), f'No figure for {city}.')


THINK = 'Population and area are needed; population first.'
ACT_POP = '{"thought": "Population first.", "action": {"tool": "population", "args": {"city": "Paris"}}}'
BEAT = '{"summary": "Paris has 2.1 million people; the area is missing.", "heartbeat": "Looking up the area."}'
THINK_2 = 'Now the area of Paris.'
ACT_AREA = '{"thought": "The area.", "action": {"tool": "area", "args": {"city": "Paris"}}}'
ANSWER = 'About 20,000 people per km² (2.1 million on 105 km²).'
FINAL = '{"summary": "2.1 million on 105 km².", "final_answer": "%s"}' % ANSWER
SCRIPT = [THINK, ACT_POP, BEAT, THINK_2, ACT_AREA, FINAL]


@pytest.fixture
def folder(tmp_path):
    "A copy of the example pipeline's folder, to edit."
    return Path(shutil.copytree(EXAMPLE, tmp_path / 'pipelines'))


def edit(folder: Path, change) -> Path:
    "Apply `change` to the content of the copied YAML file and write it back; its path."
    path = folder / 'think_act_observe.yaml'
    d = yaml.safe_load(path.read_text())
    change(d)
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


def ask(pipeline, script, question=QUESTION):
    "(the scripted model with its recorded calls, the run) for `pipeline` answering `question`."
    llm = ScriptedLLM(script)
    return llm, PipelineAgent(llm, [population, area], pipeline).run(question)


def prompt(call: dict) -> str: return call['messages'][-1]['content']


def test_the_example_sends_each_stage_its_own_temperature_mode_and_prompt():
    llm, run = ask(EXAMPLE / 'think_act_observe.yaml', SCRIPT)
    assert (run.stop_reason, run.answer) == ('answer', ANSWER)
    assert [(c['temperature'], c['json_mode'], c['tools']) for c in llm.calls] == \
        [(0.7, False, None), (0.1, True, None), (0.2, True, None)] * 2
    think, act, observe = llm.calls[:3]
    assert [m['role'] for m in think['messages']] == ['system', 'user']
    assert prompt(think).startswith('# Stage: think (iteration 1 of 5)') and QUESTION in prompt(think)
    # tools off for thinking: their names only, no parameters, no call format; the act stage gets all of it
    assert '- population: The population of a city' in prompt(think)
    assert 'Parameters:' not in prompt(think) and TOOL_FORMAT not in prompt(think)
    assert '## population' in prompt(act) and TOOL_FORMAT in prompt(act) and THINK in prompt(act)
    assert FINAL_FORMAT in prompt(observe) and "called population(city='Paris') → 2.1" in prompt(observe)
    assert "called area(city='Paris') → 105" in prompt(llm.calls[5])
    assert [s.task for s in run.steps] == ['think', 'act', 'act', 'observe'] * 2
    assert [s.usage.tool_calls for s in run.steps if s.task == 'act'] == [0, 1, 0, 1]


def test_a_stage_added_to_the_yaml_is_one_more_call_with_its_own_prompt(folder):
    (folder / 'check.md').write_text('# Stage: check\nResults so far:\n{history}\n\nIs the last result right?\n')
    stage = {'name': 'check', 'when': 'loop', 'prompt': 'check.md', 'temperature': 0.0, 'output': 'text'}
    path = edit(folder, lambda d: d['stages'].insert(2, stage))
    llm, run = ask(path, [THINK, ACT_POP, 'Yes, the population.', FINAL])
    assert run.stop_reason == 'answer' and len(llm.calls) == 4
    check = llm.calls[2]
    assert prompt(check).startswith('# Stage: check') and "called population(city='Paris')" in prompt(check)
    assert (check['temperature'], check['json_mode']) == (0.0, False)
    assert '[iteration 1] check: Yes, the population.' in prompt(llm.calls[3])
    assert channels(run)['flow'][2] == 'Yes, the population.'


def test_a_temperature_changed_in_the_yaml_is_what_the_model_gets(folder):
    path = edit(folder, lambda d: d['stages'][0].update(temperature=1.3))
    llm, _ = ask(path, SCRIPT)
    assert [c['temperature'] for c in llm.calls] == [1.3, 0.1, 0.2] * 2


def test_tools_switched_on_for_thinking_offer_the_tools_and_run_its_call(folder):
    path = edit(folder, lambda d: d['stages'][0].update(tools=True, output='json'))
    llm, run = ask(path, [ACT_POP, ACT_AREA, FINAL])
    think = llm.calls[0]
    assert think['json_mode'] and TOOL_FORMAT in prompt(think) and '## population' in prompt(think)
    assert [(s.task, s.usage.llm_calls, s.usage.tool_calls) for s in run.steps] == \
        [('think', 1, 0), ('think', 0, 1), ('act', 1, 0), ('act', 0, 1), ('observe', 1, 0)]
    assert run.answer == ANSWER


def test_the_cap_in_the_yaml_ends_a_loop_that_never_finishes(folder):
    path = edit(folder, lambda d: d.update(max_iterations=2))
    llm, run = ask(path, [THINK, ACT_POP, BEAT] * 2)  # a third round would run out of script: llm_error
    assert (run.stop_reason, len(llm.calls)) == ('max_steps', 6)
    assert run.steps[-1].safeguards[0].kind == 'max_steps' and run.answer.startswith('No conclusion was reached.')
    ch = channels(run)
    assert ch['error'] == ['The loop reached max_iterations=2 without a final answer.']
    assert ch['user'] == ['Looking up the area.', 'Looking up the area.', run.answer]


def test_an_after_stage_writes_the_answer_once_the_cap_is_hit(folder):
    wrap = {'name': 'wrap_up', 'when': 'after', 'output': 'final_answer',
            'template': 'Question: {question}\nFound:\n{history}\n{protocol}'}
    path = edit(folder, lambda d: (d.update(max_iterations=1), d['stages'].append(wrap)))
    llm, run = ask(path, [THINK, ACT_POP, BEAT, '{"summary": "Only the population.", "final_answer": "2.1 million."}'])
    assert (run.stop_reason, run.answer, len(llm.calls)) == ('max_steps', '2.1 million.', 4)
    assert prompt(llm.calls[3]).startswith('Question: ') and '[after]' not in prompt(llm.calls[3])


def test_a_heartbeat_does_not_end_the_loop():
    llm, run = ask(EXAMPLE / 'think_act_observe.yaml', SCRIPT)
    assert len(llm.calls) == 6 and run.answer == ANSWER
    outs = [(e.stage, e.channel, e.final) for e in run.extra if e.type == 'stage' and e.channel == 'user']
    assert outs == [('observe', 'user', False), ('observe', 'user', True)]


def test_a_heartbeat_stage_reports_to_the_user_and_never_ends_the_loop(folder):
    status = {'name': 'status', 'when': 'loop', 'output': 'heartbeat', 'template': 'Say what you are doing: {flow}'}
    path = edit(folder, lambda d: (d['stages'].insert(0, status), d.update(max_iterations=2)))
    llm, run = ask(path, ['Starting on Paris.', *SCRIPT[:3], 'Now the area.', *SCRIPT[3:]])
    assert (run.stop_reason, run.answer, len(llm.calls)) == ('answer', ANSWER, 8)
    assert channels(run)['user'] == ['Starting on Paris.', 'Looking up the area.', 'Now the area.', ANSWER]
    assert llm.calls[0]['json_mode'] is False and 'plain text' in prompt(llm.calls[0])


def test_the_channels_keep_user_flow_and_error_apart_and_load_back(tmp_path):
    bad_call = '{"action": {"tool": "populaton", "args": {"city": "Paris"}}}'
    llm, run = ask(EXAMPLE / 'think_act_observe.yaml', [THINK, bad_call, BEAT, THINK_2, ACT_AREA, FINAL])
    ch = channels(run)
    assert ch['user'] == ['Looking up the area.', ANSWER] and len(ch['flow']) == 6
    assert len(ch['error']) == 1 and ch['error'][0].startswith("populaton(city='Paris') failed: Unknown tool")
    assert "→ FAILED: Unknown tool 'populaton'. Did you mean 'population'?" in prompt(llm.calls[2])
    back = Run.load(run.save(tmp_path / 'run.jsonl'))
    assert channels(back) == ch and back.answer == ANSWER and back.meta['architecture'] == 'pipeline'
    assert [e.stage for e in back.extra if e.type == 'stage' and e.channel == 'flow'] == ['think', 'act', 'observe'] * 2


def test_a_model_that_fails_stops_the_run_with_an_error_not_an_exception():
    def down(messages, **kw): raise ConnectionError('no route to the model')
    run = PipelineAgent(FunctionLLM(down), [population], EXAMPLE / 'think_act_observe.yaml').run(QUESTION)
    assert (run.stop_reason, channels(run)['error']) == ('llm_error', ['the model call failed: ConnectionError: no '
                                                                       'route to the model'])
    llm, run = ask(EXAMPLE / 'think_act_observe.yaml', [THINK, 'no JSON', '{"answer": "not a call"}', '[1, 2]'])
    assert run.stop_reason == 'parse_failures' and len(llm.calls) == 4
    assert channels(run)['error'][0].startswith('no usable reply after 2 correction rounds')


def test_a_registry_that_raises_is_an_internal_error_in_the_run():
    class Broken(ToolRegistry):
        def call(self, *a, **kw): raise RuntimeError('the registry broke')
    llm = ScriptedLLM(SCRIPT)
    run = PipelineAgent(llm, Broken([population, area]), EXAMPLE / 'think_act_observe.yaml').run(QUESTION)
    assert run.stop_reason == 'error' and run.steps[-1].safeguards[0].kind == 'internal_error'
    assert 'the registry broke' in channels(run)['error'][-1]


BAD = [  # (change to the YAML content, words the error must have)
    (lambda d: d['stages'][0].update(temprature=0.5), "unknown key 'temprature'"),
    (lambda d: d.update(stage=[]), "unknown key 'stage'"),
    (lambda d: d['stages'][0].update(prompt='plan.md'), 'the prompt file'),
    (lambda d: d['stages'][1].update(output='tool_call'), "output: 'tool_call' is not one of"),
    (lambda d: [s.update(when='after') for s in d['stages']], 'no loop stage'),
    (lambda d: d.update(max_iterations=0), 'max_iterations: 0 is not a whole number from 1 to 100'),
    (lambda d: d.update(max_iterations=-3), 'max_iterations: -3'),
    (lambda d: d['stages'][0].update(tools='sometimes'), "tools: 'sometimes' is not true or false"),
    (lambda d: d['stages'][0].update(temperature=9), 'temperature: 9 is not a number from 0 to 2'),
    (lambda d: d['stages'][2].update(name='think'), "two stages are named 'think'"),
    (lambda d: d.update(stages=[]), 'no stages'),
]


@pytest.mark.parametrize('change, words', BAD)
def test_a_bad_yaml_is_one_error_naming_the_file_and_the_problem(folder, change, words):
    path = edit(folder, change)
    with pytest.raises(UserError) as e:
        PipelineAgent(ScriptedLLM([]), [population], path)
    msg = str(e.value)
    assert words in msg and str(path) in msg and '\n' not in msg, msg


def test_an_unknown_placeholder_in_a_prompt_file_is_found_at_load_time(folder):
    (folder / 'observe.md').write_text('Results: {results}\n{protocol}\n')
    llm = ScriptedLLM([])
    with pytest.raises(UserError) as e:
        PipelineAgent(llm, [population], folder / 'think_act_observe.yaml')
    assert str(e.value).startswith(f"unknown placeholder {{results}} in {folder / 'observe.md'}")
    assert llm.calls == []


def test_a_missing_file_and_broken_yaml_name_where(folder):
    with pytest.raises(UserError, match='no file'): load_pipeline(folder / 'nope.yaml')
    path = folder / 'think_act_observe.yaml'
    path.write_text(path.read_text().replace('max_iterations: 5', 'max_iterations: [5'))
    with pytest.raises(UserError) as e: load_pipeline(path)
    assert str(e.value).startswith('not valid YAML') and f'{path}:' in str(e.value)


def test_over_http_each_stage_reaches_the_server_with_its_settings():
    backing = ScriptedLLM(SCRIPT)
    with ModelServer(backing) as srv:
        llm = OpenAIChat('test-model', base_url=srv.base_url, timeout=5, max_retries=0)
        run = PipelineAgent(llm, [population, area], EXAMPLE / 'think_act_observe.yaml').run(QUESTION)
    assert (run.stop_reason, run.answer, run.usage.tool_calls) == ('answer', ANSWER, 2)
    assert [(c['temperature'], c['json_mode']) for c in backing.calls] == [(0.7, False), (0.1, True), (0.2, True)] * 2
    assert backing.calls[0]['messages'][0]['content'].startswith('You are one stage of an agent')


BOMB = 'a: &a [x, x, x, x, x, x, x, x, x, x]\n' + ''.join(
    f'{chr(98 + i)}: &{chr(98 + i)} [' + ', '.join([f'*{chr(97 + i)}'] * 10) + ']\n' for i in range(8))


@pytest.mark.parametrize('text, words', [
    (BOMB, 'the YAML expands to more than 100,000 values'),
    ('name: deep\nstages: ' + '[' * 100_000 + ']' * 100_000 + '\n', 'the YAML nests deeper than'),
    ('stages: &s [{name: think, when: loop, template: "x", more: *s}]\n', 'the YAML alias *s refers to itself')])
def test_yaml_that_would_hang_or_blow_the_stack_is_refused_with_one_line(folder, text, words):
    path = folder / 'bad.yaml'
    path.write_text(text)
    with pytest.raises(UserError) as e: load_pipeline(path)
    assert str(e.value).startswith(words) and f'{path}:' in str(e.value) and '\n' not in str(e.value)


@pytest.mark.parametrize('prompt', ['/etc/passwd', '../../../../../../../../etc/passwd', 'secret.md', 'fifo.md',
                                    '/dev/zero'])
def test_prompt_files_outside_the_folder_or_not_regular_never_reach_the_model(folder, prompt):
    secret = folder.parent / 'secret.txt'
    secret.write_text('the password is hunter2')
    (folder / 'secret.md').symlink_to(secret)
    os.mkfifo(folder / 'fifo.md')
    path = edit(folder, lambda d: d['stages'][0].update(prompt=prompt))
    llm = ScriptedLLM([])
    with pytest.raises(UserError) as e: PipelineAgent(llm, [population], path)
    assert 'cannot read the prompt file' in str(e.value) and llm.calls == []


def test_a_hostile_pipeline_is_one_error_line_from_the_cli(folder):
    from reach_cli import run_reach
    (folder / 'bomb.yaml').write_text(BOMB)
    r = run_reach('ask', '--model', 'sim-analyst', '--agent', 'pipeline', '--pipeline', 'bomb.yaml', 'Why?',
                  cwd=folder, timeout=60)
    assert r.returncode != 0 and r.stderr.startswith('Error: the YAML expands to more than') and \
        r.stderr.count('\n') == 1, r.stderr
