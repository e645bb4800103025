"""The architectures benchmark (`reach_nb.bench.agents`) on the real risk tools: what it measures and how it reports it.
Benchmarks are not tests, so nothing here asserts a wall time; it checks the figures that do not vary (model calls,
tokens, tool calls, the cause named), that the waits are the stated latency, and the arithmetic of the report."""
import pytest
from reach_nb.core import UserError
from reach_nb.bench.agents import (ARCHITECTURES, Figures, agents_table, bench_agents, measure, plot_agents,
                                   target_lines)
from reach_nb.risk.data import ensure_dataset


@pytest.fixture(scope='module')
def quick():
    "Every architecture with no latency: the figures other than time."
    return {r.agent: r for r in bench_agents(per_call=0, per_token=0, db=ensure_dataset())}


def test_every_architecture_names_the_planted_cause(quick):
    assert list(quick) == list(ARCHITECTURES) == ['react', 'plan-execute', 'rewoo', 'dag', 'router', 'pipeline']
    assert all(r.names_cause and r.stop_reason == 'answer' and r.tool_calls == 10 for r in quick.values()), quick


def test_the_calls_each_architecture_makes(quick):
    calls = {a: r.calls for a, r in quick.items()}
    assert (calls['react'], calls['rewoo'], calls['dag']) == (7, 2, 2)
    assert calls['plan-execute'] == calls['router'] > calls['react']  # a replanner call after every step
    assert calls['pipeline'] == 12  # think, act, observe: four rounds
    assert quick['rewoo'].prompt_tokens < quick['react'].prompt_tokens / 3  # each result sent once, to the solver


def test_the_model_waits_as_stated():
    f = measure('rewoo', per_call=0.05, per_token=0.001)
    assert f.model_wait == pytest.approx(0.05 * f.calls + 0.001 * f.completion_tokens)
    assert f.wall_time >= f.model_wait and f.names_cause


def test_the_table_gives_ratios_to_react():
    rows = [Figures('react', 7, 28000, 1200, 30.0, 29.0, 10, True),
            Figures('rewoo', 2, 5600, 900, 20.0, 19.5, 10, True),
            Figures('dag', 2, 7000, 1000, 6.0, 5.0, 10, False)]
    lines = agents_table(rows).splitlines()
    assert [l.split()[-2:] for l in lines[1:]] == [['1.0x', '1.0x'], ['5.0x', '1.5x'], ['4.0x', '5.0x']]
    assert ' NO ' in lines[3]


def test_targets_say_met_or_missed_and_why():
    react = Figures('react', 7, 28000, 1200, 30.0, 29.0, 10, True)
    met = target_lines([react, Figures('rewoo', 2, 5600, 900, 20.0, 19.5, 10, True),
                        Figures('dag', 2, 7000, 1000, 6.0, 5.0, 10, True)])
    assert [l.endswith('met.') for l in met] == [True, True]
    missed = target_lines([react, Figures('rewoo', 2, 7000, 900, 20.0, 19.5, 10, True),
                           Figures('dag', 2, 7000, 1000, 24.0, 23.0, 10, True)], per_token=0.02)
    assert missed[0].startswith('rewoo prompt tokens: 4.0x lower than ReAct (target at least 5x;')
    assert 'missed. ReAct here made 7 model calls for 10 tool calls' in missed[0]
    assert 'missed. Most of the time is the model writing: ReAct waited 29.0 s of 30.0 s' in missed[1]
    assert target_lines([react]) == []  # no figures for the architectures a target is about: nothing to say


def test_the_chart(tmp_path):
    rows = [Figures('react', 7, 28000, 1200, 30.0, 29.0, 10, True), Figures('dag', 2, 7000, 1000, 6.0, 5.0, 10, False)]
    fig = plot_agents(rows, 'title')
    fig.savefig(tmp_path/'c.png')
    assert (tmp_path/'c.png').stat().st_size > 10_000 and len(fig.axes) == 5
    assert [b.get_hatch() or '' for b in fig.axes[0].patches] == ['', '//']  # the answer that missed the cause


def test_an_unknown_architecture_is_a_user_error():
    with pytest.raises(UserError, match="unknown agents \\['swarm'\\] in bench_agents"): bench_agents(agents=['swarm'])
