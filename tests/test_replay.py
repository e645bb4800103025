"A run against a real HTTP endpoint, recorded once, replays byte for byte offline."
from reach_nb.risk.agents import risk_agent
from reach_nb.risk.analysis import SPIKE_QUESTION
from reach_nb.risk.analyst import SimAnalyst
from reach_nb.llm.models import OpenAIChat, RecordingLLM, ReplayLLM, CassetteMismatch
from reach_nb.llm.server import ModelServer
import pytest

def _essentials(run):
    return [(s.raw, s.parse_level, [str(a) for a in s.actions], [o.content for o in s.observations], s.answer, s.usage.prompt_tokens, s.usage.completion_tokens)
            for s in run.steps]

def test_recorded_http_run_replays_identically(tmp_path):
    cassette = tmp_path/'demo.cassette.jsonl'
    with ModelServer(SimAnalyst(), model_name='sim-analyst') as srv:
        live_llm = RecordingLLM(OpenAIChat('sim-analyst', base_url=srv.base_url, max_retries=0), cassette)
        with risk_agent(live_llm) as agent: live = agent.run(SPIKE_QUESTION)
    assert live.stop_reason == 'answer' and len(live.steps) > 5
    assert live.meta['simulated'] is True  # the server said so, and the HTTP client's run is labelled
    with risk_agent(ReplayLLM(cassette)) as agent: replayed = agent.run(SPIKE_QUESTION)
    assert _essentials(replayed) == _essentials(live)
    assert replayed.answer == live.answer

def test_replay_refuses_a_different_conversation(tmp_path):
    cassette = tmp_path/'demo.cassette.jsonl'
    with risk_agent(RecordingLLM(SimAnalyst(), cassette), max_steps=3) as agent: agent.run(SPIKE_QUESTION)
    with pytest.raises(CassetteMismatch):
        ReplayLLM(cassette).chat([{'role': 'user', 'content': 'something else'}], json_mode=True)
