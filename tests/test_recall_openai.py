"""OpenAIEmbedder over real HTTP: the real `openai` SDK against a small OpenAI-compatible `/v1/embeddings` endpoint
that this test runs with FastAPI and uvicorn on 127.0.0.1 (a free port), answering with the offline embedder's
vectors. Nothing is patched: the SDK builds, sends and parses real requests.
"""
import base64, threading, time

import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from reach_nb.core import UserError
from reach_nb.memory.recall import LongTermMemory, OpenAIEmbedder, default_embedder


class EmbeddingServer:
    "An OpenAI-compatible embeddings endpoint backed by an offline embedder, in a background thread."
    def __init__(self, embedder, wrong_count:bool=False):
        self.embedder, self.requests, self.wrong_count = embedder, [], wrong_count
        self.app = FastAPI()
        self.app.post('/v1/embeddings')(self.embeddings)

    async def embeddings(self, request:Request):
        body = await request.json()
        self.requests.append(body)
        texts = [body['input']] if isinstance(body['input'], str) else body['input']
        if self.wrong_count: texts = texts[:-1]
        vecs = self.embedder.embed(texts)
        b64 = body.get('encoding_format') == 'base64'
        emb = lambda v: base64.b64encode(v.astype('<f4').tobytes()).decode() if b64 else v.tolist()
        return JSONResponse({'object': 'list', 'model': body['model'],
                             'data': [{'object': 'embedding', 'index': i, 'embedding': emb(v)} for i, v in enumerate(vecs)],
                             'usage': {'prompt_tokens': len(texts), 'total_tokens': len(texts)}})

    def __enter__(self):
        cfg = uvicorn.Config(self.app, host='127.0.0.1', port=0, log_level='warning', access_log=False, lifespan='off')
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline: raise RuntimeError('embedding server did not start')
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f'http://127.0.0.1:{port}/v1'
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope='module')
def offline(): return default_embedder()


def test_vectors_arrive_as_the_offline_embedder_made_them(offline):
    texts = ['Report all money amounts in CNY.', '金额要用哪种货币展示？', 'x' * 20_000, '']
    with EmbeddingServer(offline) as srv:
        emb = OpenAIEmbedder('offline-e5', base_url=srv.base_url, api_key='test-key', batch=3)
        X = emb.embed(texts)
        assert emb.dim == offline.dim and len(srv.requests) == 3   # two batches, then one probe for the dimension
    assert X.shape == (4, offline.dim)
    np.testing.assert_allclose(X[:2], offline.embed(texts[:2]), atol=1e-5)
    assert [r['encoding_format'] for r in srv.requests] == ['float'] * 3 and srv.requests[0]['model'] == 'offline-e5'
    assert len(srv.requests[0]['input'][2]) == 8000 and srv.requests[1]['input'] == ['.']   # cut; never empty
    assert emb.name == 'openai:offline-e5'


def test_long_term_memory_through_the_endpoint(offline, tmp_path):
    with EmbeddingServer(offline) as srv:
        emb = OpenAIEmbedder('offline-e5', base_url=srv.base_url, dim=offline.dim)
        with LongTermMemory(tmp_path/'m.duckdb', emb, threshold=offline.threshold) as ltm:
            ltm.add('Report all money amounts in CNY, never in USD.', 'preference')
            ltm.add('The team lunch moved to Thursday this week.', 'note')
            got = ltm.recall('Which currency should the totals be shown in?')
        assert [r.memory.kind for r in got] == ['preference']
        with pytest.raises(UserError, match='open it with the embedder that wrote it'): LongTermMemory(tmp_path/'m.duckdb', offline)


def test_a_wrong_answer_is_refused(offline):
    with EmbeddingServer(offline, wrong_count=True) as srv:
        emb = OpenAIEmbedder('offline-e5', base_url=srv.base_url, dim=offline.dim)
        with pytest.raises(ValueError, match='returned 1 vectors for 2 texts'): emb.embed(['one', 'two'])
