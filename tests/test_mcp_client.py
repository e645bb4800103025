"""The MCP client against real server processes (tests/mcp_servers/): tools from schemas (a pydantic model argument
among them), error results, timeouts, non-text content, a server that crashes or is killed mid-call and comes back at the next call,
a server that does not start, tools that appear while an agent runs, and config files with several servers."""
import asyncio, json, os, re, signal, subprocess, sys, threading, time

import pytest

from reach_nb.core import UserError
from reach_nb.llm.models import ScriptedLLM
from reach_nb.mcp_tools import MCPTools, load_mcp_config, mcp_registry
from reach_nb.agents.react import ReActAgent
from reach_nb.tools import ToolRegistry

from mcp_servers.support import FAULTS, MODELS, fault_spec


@pytest.fixture(params=['auto', 'legacy'])
def faults(request):
    "The fault server's tools in a registry, over the 2026 protocol ('auto' negotiates it) and the handshake era."
    hub = MCPTools(ToolRegistry(timeout=30), mode=request.param)
    hub.add('faults', fault_spec())
    yield hub
    hub.close()


def _act(tool:str, **args) -> str: return json.dumps({'thought': f'Call {tool}.', 'actions': [{'tool': tool, 'args': args}]})
def _answer(text:str) -> str: return json.dumps({'thought': 'Done.', 'answer': text})


def test_tools_come_from_the_schemas(faults):
    reg = faults.registry
    assert reg.names == ['echo', 'pid', 'slow', 'crash', 'fail', 'picture', 'document', 'grow']
    assert reg['echo'].source == "MCP server 'faults'" and "From MCP server 'faults'." in reg.render_prompt()
    ob = reg.call('slow', {'seconds': '0.05'})  # a number sent as a string is coerced by the schema's type
    assert (ob.ok, ob.args, ob.content) == (True, {'seconds': 0.05}, 'waited 0.05s')
    ob = reg.call('ecko', {'text': 'x'})
    assert (ob.ok, ob.error, ob.suggestion) == (False, 'unknown_tool', 'echo')
    ob = reg.call('echo', {'txt': 'x'})
    assert (ob.ok, ob.error) == (False, 'bad_args') and "did you mean 'text'" in ob.content
    assert reg.canonical_call('echo', {'Text': 'x'}) == reg.canonical_call('echo', {'text': 'x'}) == ('echo', {'text': 'x'})


def test_an_error_result_is_an_error_observation(faults):
    ob = faults.registry.call('fail', {'message': 'account u42 is archived'})
    assert (ob.ok, ob.error) == (False, 'tool_error')
    assert ob.content == "MCP server 'faults' reported an error from 'fail': Error executing tool fail: account u42 is archived"


def test_non_text_content_is_described(faults):
    assert faults.registry.call('picture').content == '[image image/png, 70 bytes: not shown, this agent reads text only]'
    assert faults.registry.call('document').content == '[resource memo://rules, text/plain]\nFlag refunds over 500.'


def test_a_call_timeout_leaves_the_connection_usable():
    with MCPTools() as hub:
        hub.add('faults', fault_spec(timeout=1))  # the config's per-call timeout
        t0 = time.perf_counter()
        ob = hub.registry.call('slow', {'seconds': 20})
        assert time.perf_counter() - t0 < 10
        assert (ob.ok, ob.error) == (False, 'timeout')
        assert ob.content.startswith("Tool 'slow' (from MCP server 'faults') did not finish within 1s")
        assert hub.registry.call('echo', {'text': 'still here'}).content == 'still here'
        assert hub.servers['faults'].starts == 1


def test_a_crash_mid_call_is_an_error_observation_then_the_server_restarts(faults):
    reg = faults.registry
    first = reg.call('pid').content
    t0 = time.perf_counter()
    ob = reg.call('crash')
    assert time.perf_counter() - t0 < 10  # no hang: the closed connection ends the call
    assert (ob.ok, ob.error) == (False, 'tool_error')
    assert ob.content.startswith("MCP server 'faults' stopped during the call to 'crash' (its connection closed)")
    assert 'it wrote: fault_server: crashing on purpose' in ob.content
    assert 'will be started again at the next call' in ob.content
    ob = reg.call('echo', {'text': 'back'})
    assert (ob.ok, ob.content, faults.servers['faults'].starts) == (True, 'back', 2)
    assert reg.call('pid').content != first


def test_a_server_killed_from_outside_mid_call(faults):
    reg = faults.registry
    pid = int(reg.call('pid').content)
    threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
    t0 = time.perf_counter()
    ob = reg.call('slow', {'seconds': 60})
    assert time.perf_counter() - t0 < 10
    assert (ob.ok, ob.error) == (False, 'tool_error') and 'stopped during the call' in ob.content
    assert int(reg.call('pid').content) not in (pid, 0)


def test_a_server_that_died_between_calls_is_restarted_before_the_next(faults):
    pid = int(faults.registry.call('pid').content)
    os.kill(pid, signal.SIGKILL)
    time.sleep(1)
    ob = faults.registry.call('echo', {'text': 'again'})
    assert (ob.ok, ob.content, faults.servers['faults'].starts) == (True, 'again', 2)


def test_a_server_that_fails_to_start_names_its_command():
    with pytest.raises(UserError) as e: MCPTools().add('broken', fault_spec('--fail'))
    msg = str(e.value)
    assert msg.startswith("MCP server 'broken' did not start (it exited, or closed the connection); "
                          "it wrote: fault_server: refusing to start (--fail given) in command `")
    assert f"{FAULTS} --fail`: check that it runs by itself in a terminal" in msg
    with pytest.raises(UserError, match=r"did not start \(the program was not found\) in command `no-such-mcp-server -v`"):
        MCPTools().add('missing', {'command': 'no-such-mcp-server', 'args': ['-v']})


def test_a_tool_added_by_the_server_is_used_at_the_next_step(faults):
    llm = ScriptedLLM([_act('grow'), _act('late', text='new tool'), _answer('It works.')])
    run = ReActAgent(llm, faults.registry).run('Grow a tool, then use it.')
    obs = [o for s in run.steps for o in s.observations]
    assert [(o.tool, o.ok, o.content) for o in obs] == [('grow', True, 'added late'), ('late', True, 'NEW TOOL')]
    assert faults.registry['late'].source == "MCP server 'faults'"
    listed = ['## late' in c['messages'][0]['content'] for c in llm.calls]
    assert listed == [False, True, True]  # the prompt lists the new tool from the next step on


@pytest.mark.parametrize('kw', [{}, {'ask_user': True}, {'safeguards': {'coercion': False}}, {'mode': 'native'}])
def test_the_prompt_lists_a_tool_the_server_adds_mid_run(faults, kw, tmp_path):
    "Whatever copy of the registry an agent works on, a tool the server adds is offered at the next step."
    if kw.get('mode') == 'native':
        from reach_nb.core import ToolCall
        from reach_nb.llm.models import LLMResponse
        call = lambda name, **a: LLMResponse(content='', tool_calls=[ToolCall(id=name, tool=name, args=a)])
        llm = ScriptedLLM([call('grow'), call('late', text='x'), LLMResponse(content='It works.')])
    else: llm = ScriptedLLM([_act('grow'), _act('late', text='x'), _answer('It works.')])
    run = ReActAgent(llm, faults.registry, **kw).run('Grow a tool, then use it.')
    assert [o.content for s in run.steps for o in s.observations] == ['added late', 'X']
    if kw.get('mode') == 'native': offered = [[t['function']['name'] for t in c['tools']] for c in llm.calls]
    else: offered = [re.findall(r'^## (\S+)', c['messages'][0]['content'], re.M) for c in llm.calls]
    assert ['late' in o for o in offered] == [False, True, True]
    run.save(tmp_path/'run.jsonl')
    back = type(run).load(tmp_path/'run.jsonl')
    assert [back.prompt_at(k) for k in (1, 2, 3)] == [c['messages'] for c in llm.calls]


def test_servers_added_and_removed_while_the_agent_lives():
    with MCPTools() as hub:
        hub.add('a', fault_spec())
        agent = ReActAgent(ScriptedLLM([_act('echo', text='one'), _answer('one')]), hub.registry)
        assert agent.run('Echo one.').steps[0].observations[0].content == 'one'
        version = hub.registry.version
        assert hub.add('b', fault_spec())[:2] == ['b__echo', 'b__pid']
        assert hub.registry.version > version and hub.registry.names[:2] == ['a__echo', 'a__pid']
        llm = ScriptedLLM([_act('b__echo', text='two'), _answer('two')])
        agent.llm = llm
        run = agent.run('Echo two on b.')
        assert (run.steps[0].observations[0].ok, run.steps[0].observations[0].content) == (True, 'two')
        assert '## b__echo' in llm.calls[0]['messages'][0]['content'] and '## a__echo' in llm.calls[0]['messages'][0]['content']
        hub.remove('a')
        assert hub.registry.names[:2] == ['echo', 'pid']
        ob = hub.registry.call('a__echo', {'text': 'gone'})
        assert (ob.ok, ob.error, ob.suggestion) == (False, 'unknown_tool', 'echo')


def test_a_config_file_with_two_servers(tmp_path):
    cfg = tmp_path / 'servers.json'
    cfg.write_text(json.dumps({'mcpServers': {'left': fault_spec(), 'right': fault_spec(),
                                              'off': {'command': 'nothing', 'disabled': True}}}))
    assert list(load_mcp_config(cfg)) == ['left', 'right']
    reg = mcp_registry(cfg)
    try:
        assert reg.names[:3] == ['left__echo', 'left__pid', 'left__slow'] and 'right__grow' in reg.names
        a, b = reg.call_many([{'tool': 'left__pid'}, {'tool': 'right__pid'}])
        assert a.ok and b.ok and a.content != b.content  # two processes
    finally: reg.mcp.close()
    assert reg.names == []


def test_a_config_with_one_bad_server_closes_the_good_one(tmp_path):
    cfg = tmp_path / 'servers.json'
    cfg.write_text(json.dumps({'mcpServers': {'good': fault_spec(), 'bad': fault_spec('--fail')}}))
    with pytest.raises(UserError, match="MCP server 'bad' did not start"): mcp_registry(cfg)
    assert subprocess.run(['pgrep', '-f', str(FAULTS)], capture_output=True).stdout == b''  # 'good' was stopped too
    cfg.write_text(json.dumps({'mcpServers': {'bad': {'args': []}}}))
    with pytest.raises(UserError, match=r"""server 'bad' has neither "command" nor "url" in .*servers.json: give"""):
        mcp_registry(cfg)


def test_async_callers_and_a_running_loop(faults):
    reg = faults.registry
    async def inside_a_loop():
        asyncio.get_running_loop()
        sync = reg.call('echo', {'text': 'sync in a loop'})  # as in a notebook cell
        both = await reg.acall_many([{'tool': 'echo', 'args': {'text': 'a'}}, {'tool': 'slow', 'args': {'seconds': 0.1}}])
        return [sync.content] + [o.content for o in both]
    assert asyncio.run(inside_a_loop()) == ['sync in a loop', 'a', 'waited 0.1s']


def test_the_trace_names_each_tools_server(faults, tmp_path):
    run = ReActAgent(ScriptedLLM([_act('echo', text='hi'), _answer('hi')]), faults.registry).run('Echo hi.')
    loaded = type(run).load(run.save(tmp_path / 'run.jsonl'))
    system = loaded.meta['head'][0]['content']  # the prompt the run started with, kept in the trace
    assert "## echo\nSay `text` back.\nFrom MCP server 'faults'." in system
    assert loaded.steps[0].observations[0].content == 'hi'


def test_a_server_tool_named_like_a_local_tool_takes_the_prefix():
    def echo(text:str): # what to say
        "Say `text` back, locally."
        return f'local {text}'
    with MCPTools(ToolRegistry([echo])) as hub:
        hub.add('faults', fault_spec())
        reg = hub.registry
        assert reg.names[:3] == ['echo', 'faults__echo', 'pid']
        assert (reg.call('echo', {'text': 'x'}).content, reg.call('faults__echo', {'text': 'x'}).content) == ('local x', 'x')
    assert hub.registry.names == ['echo']  # closing takes only the server's tools away


def test_a_model_argument_is_shown_and_checked_before_the_call():
    with MCPTools() as hub:
        hub.add('models', {'command': sys.executable, 'args': [str(MODELS)]})
        reg = hub.registry
        prompt = reg.render_prompt()
        assert ("- query (object {table: string, window: object Window {start: string, days?: integer}, "
                "tags?: array of string}, required)") in prompt, prompt
        assert "Example: run_query(query={'table': '…', 'window': {'start': '…'}}, dry=False)" in prompt, prompt
        assert set(reg['run_query'].schema()['function']['parameters']['$defs']) == {'Query', 'Window'}
        ob = reg.call('run_query', {'query': 'orders last week'})  # a string for the object: refused here
        assert (ob.ok, ob.error) == (False, 'bad_args')
        assert ob.content.startswith("Bad arguments for run_query: 'query' expects object {table: string, "), ob.content
        ob = reg.call('run_query', {'query': {'table': 'orders', 'window': {'start': 20240501}, 'tags': 'x'}})
        assert (ob.ok, ob.error) == (False, 'bad_args')
        assert "'query.window.start' expects string, got 20240501" in ob.content, ob.content
        ob = reg.call('run_query', {'query': {'table': 'orders'}})
        assert "'query' is missing 'window' (object Window {start: string, days?: integer})" in ob.content, ob.content
        assert reg.call('calls_seen').content == '0'  # none of them reached the server
        ob = reg.call('run_query', {'query': '{"table": "orders", "window": {"start": "2024-05-01", "days": 3}}'})
        assert (ob.ok, ob.content) == (True, 'orders from 2024-05-01 for 3 days'), ob.content
        assert reg.call('calls_seen').content == '1'


def test_the_first_call_does_not_compile_the_iri_grammar():
    code = ("import sys; sys.path.insert(0, 'tests')\n"
            "from reach_nb.mcp_tools import MCPTools\nfrom mcp_servers.support import fault_spec\n"
            "with MCPTools() as hub:\n    hub.add('faults', fault_spec())\n"
            "    print(hub.registry.call('echo', {'text': 'a'}).content, 'jsonschema' in sys.modules,"
            " 'rfc3987_syntax' in sys.modules)")
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.stdout.split() == ['a', 'True', 'False'], out.stderr[-2000:]


def test_a_config_that_names_no_server_says_so(tmp_path):
    cfg = tmp_path / 'servers.json'
    cfg.write_text('{"mcpServers": {}}')
    with pytest.raises(UserError, match=r'"mcpServers" names no server in .*servers.json: add a server'): mcp_registry(cfg)
    with pytest.raises(UserError, match='"mcpServers" names no server in the MCP config'): mcp_registry({'mcpServers': {}})
    cfg.write_text(json.dumps({'mcpServers': {'off': {'command': 'x', 'disabled': True}}}))
    with pytest.raises(UserError, match=r'every server in "mcpServers" is disabled \(off\) in .*servers.json: enable one'):
        mcp_registry(cfg)


def test_an_unreachable_url_is_not_said_to_have_not_started():
    from reach_nb.mcp_tools import MCPHTTPServer
    with pytest.raises(UserError) as e: mcp_registry({'gone': 'http://127.0.0.1:9/mcp'}, start_timeout=10)
    assert str(e.value).startswith("MCP server 'gone' could not be reached (no connection: "), e.value
    with MCPHTTPServer() as http:
        with pytest.raises(UserError) as e: mcp_registry({'wrong': http.url.replace('/mcp', '/nope')}, start_timeout=10)
    assert str(e.value).startswith("MCP server 'wrong' could not be reached (it answered 'Not Found', not as an MCP "
                                   "server) in url http://127.0.0.1:"), e.value
