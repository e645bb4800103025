"""`reach bench loop --peers`: reach_nb, smolagents and LangGraph on the same scripted workload, as a user runs it.
Benchmarks are not tests, so nothing here asserts a wall time: it checks that the rows (reach_nb three times: on the main
thread, where a call's timeout is an alarm, off it, where a call goes to a worker thread, and inline) and the ratios are printed, and that without the peer frameworks the command says how to install them."""
import re

from reach_cli import clean_env, run_reach

ROW = r'  {}\s*: +(\d+\.\d) µs/step'


def test_the_three_frameworks_and_their_ratios(tmp_path):
    r = run_reach('bench', 'loop', '--peers', '--steps', '5', '--runs', '3', '--rounds', '3', cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == '', r.stderr
    out = r.stdout
    assert out.startswith('Agent loop, 5 steps (4 tool calls) x 3 runs per framework (median of 3 alternating rounds)')
    us = {k: float(re.search(ROW.format(re.escape(label)), out)[1]) for k, label in
          [('reach_nb', 'reach_nb ReActAgent'), ('worker', 'reach_nb ReActAgent, off the main thread'),
           ('inline', 'reach_nb ReActAgent, tools inline'),
           ('smolagents', 'smolagents ToolCallingAgent'),
           ('langgraph', 'LangGraph StateGraph + ToolNode')]}
    assert all(v > 0 for v in us.values()), out
    for k, label, target in [('smolagents', 'smolagents / reach_nb', 4), ('langgraph', 'LangGraph / reach_nb', 25)]:
        m = re.search(rf'  {re.escape(label)}\s*: +(\d+\.\d)x  \(target at least {target}x\); '
                      r'off the main thread (\d+\.\d)x; inline (\d+\.\d)x', out)
        for ratio, base in zip(map(float, m.groups()), ('reach_nb', 'worker', 'inline')):
            assert abs(ratio - us[k] / us[base]) <= 0.051 + 0.01 * ratio, (ratio, us)  # the ratio of the rows
    assert len(out.splitlines()) == 11, out


def test_without_the_peer_frameworks_one_line_says_what_to_install(tmp_path):
    for name in ('smolagents', 'langgraph'):  # a module of that name that fails to import, as an absent one does
        (tmp_path/f'{name}.py').write_text(f"raise ModuleNotFoundError(\"No module named '{name}'\", name='{name}')\n")
    r = run_reach('bench', 'loop', '--peers', '--runs', '1', cwd=tmp_path, env=clean_env(PYTHONPATH=str(tmp_path)))
    assert (r.returncode, r.stdout) == (2, ''), r
    assert r.stderr == ("Error: smolagents, langgraph are not installed in this Python environment: "
                        "pip install 'reach_nb[bench]'\n"), r.stderr


def test_peers_need_a_tool_step(tmp_path):
    r = run_reach('bench', 'loop', '--peers', '--steps', '1', cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith('Error: --steps must be at least 2, got 1 in option --steps'), r
