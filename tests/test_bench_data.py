"""`reach bench data` on a small dataset: reach_nb on DuckDB and on ClickHouse, polars and pandas side by side, as a
user runs it. Benchmarks are not tests, so nothing here asserts a time or a memory figure: it checks that the four
sides run and agree, that a side reading other data is caught, that several sizes give the growth (table, JSON, plot),
and that without polars the command says how to install it."""
import json, re, subprocess, sys

import duckdb, pytest

from reach_cli import clean_env, run_reach
from reach_nb.bench.data import (DIMS, PANDAS_COLUMNS, _dataset_tags, bench_data, bench_parquet_path,
                                 ensure_bench_parquet, ensure_clickhouse_copy, parquet_meta)
from reach_nb.risk.data import build_dataset

ROWS = 20_000


def test_the_four_sides_agree_and_are_printed(tmp_path):
    r = run_reach('bench', 'data', '--rows', str(ROWS), '--repeat', '1', cwd=tmp_path,
                  env=clean_env(REACH_DATA_DIR=str(tmp_path)), timeout=300)
    assert r.returncode == 0 and r.stderr == '', r.stderr
    out = r.stdout
    header = next(l for l in out.splitlines() if 'reach_nb (DuckDB file)' in l)
    assert header.split() == ['reach_nb', '(DuckDB', 'file)', 'reach_nb', '(ClickHouse)', 'polars', '(Parquet)',
                              'pandas'], header
    times = re.search(r'  time \(s\) +(\d+\.\d\d) +(\d+\.\d\d) +(\d+\.\d\d) +(\d+\.\d\d)   '
                      r'\(ClickHouse open \d+\.\d\d s, pandas load \d+\.\d\d s of it\)', out)
    peaks = re.search(r'  peak RSS \(MiB\) +(\d[\d,]*) +(\d[\d,]*) +(\d[\d,]*) +(\d[\d,]*)\n', out)
    assert times and peaks, out
    assert all(int(p.replace(',', '')) > 0 for p in peaks.groups()), out
    for who in ('reach_nb', 'reach_nb on ClickHouse'):
        assert re.search(rf' {who} / polars time = \d+\.\d\d   \(target < 1: (NOT )?met\)', out), out
        assert re.search(rf' {who} / polars peak = \d+\.\d\d   \(target < 1: (NOT )?met\)', out), out
    assert re.search(r'the faster engine at this size: (duckdb|clickhouse)\n', out), out
    assert 'vs pandas: pandas / reach_nb time = ' in out and 'results agree: total change ' in out, out
    assert f'rows in risk_{ROWS}.duckdb (built in ' in out and f', its Parquet copy risk_{ROWS}.parquet (written in ' in out, out
    assert re.search(rf', its ClickHouse copy risk_{ROWS}_[0-9a-f]{{8}} \(made in \d', out), out
    db = tmp_path/'generated'/f'risk_{ROWS}.duckdb'
    assert parquet_meta(bench_parquet_path(db))['rows'] == str(ROWS)
    assert (tmp_path/'clickhouse').is_dir()  # the embedded ClickHouse under the data folder


def test_one_engine_and_the_growth_with_size(tmp_path):
    ("--engine duckdb leaves the ClickHouse side out, --without pandas that peer; two sizes give each size's table, "
     "the growth, its JSON and plot.")
    r = run_reach('bench', 'data', '--rows', str(ROWS), '--rows', str(2 * ROWS), '--repeat', '1', '--engine', 'duckdb',
                  '--without', 'pandas', '--save', 'g.json', '--plot', 'g.png', cwd=tmp_path,
                  env=clean_env(REACH_DATA_DIR=str(tmp_path)), timeout=300)
    assert r.returncode == 0 and r.stderr == '', r.stderr
    out = r.stdout
    assert 'ClickHouse' not in out and not (tmp_path/'clickhouse').exists() and 'pandas' not in out, out
    assert out.count('results agree: total change') == 2 and 'Growth with size:' in out, out
    assert re.search(rf'  +{ROWS:,} +\d+\.\d\d s [\d,]+ MiB', out) and re.search(rf'  +{2 * ROWS:,} +\d', out), out
    assert 'reach_nb (DuckDB file): 2x the rows, ' in out, out
    saved = json.loads((tmp_path/'g.json').read_text())
    assert [(x['rows'], x['side']) for x in saved['rows']] == [(n, s) for n in (ROWS, 2 * ROWS)
                                                               for s in ('reach', 'polars')]
    assert saved['machine']['duckdb'] and len(saved['results']) == 2
    assert (tmp_path/'g.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    bad = run_reach('bench', 'data', '--rows', str(ROWS), '--engine', 'spark', cwd=tmp_path, env=clean_env())
    assert bad.returncode == 2 and bad.stderr == "Error: unknown engine 'spark' in option --engine: use duckdb or clickhouse\n", bad
    bad = run_reach('bench', 'data', '--rows', str(ROWS), '--without', 'numpy', cwd=tmp_path, env=clean_env())
    assert bad.returncode == 2 and bad.stderr == "Error: unknown peer 'numpy' in option --without: leave out polars or pandas\n", bad


@pytest.fixture(scope='module')
def two_datasets(tmp_path_factory):
    "The same size twice, from two seeds: different rows."
    d = tmp_path_factory.mktemp('bench')
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv('REACH_DATA_DIR', str(d))  # the ClickHouse copies: under the temporary folder
        yield build_dataset(d/f'risk_{ROWS}.duckdb', rows=ROWS), build_dataset(d/'other.duckdb', rows=ROWS, seed=8)


def test_the_sides_agree_on_every_figure(two_datasets):
    db, _ = two_datasets
    r = bench_data(rows=ROWS, db=db, repeat=1)
    assert r['agree'] and r['sides'] == ['reach', 'clickhouse', 'polars', 'pandas']
    assert set(r['top']) == set(DIMS) and r['total_change'] > 0
    assert r['parquet'] == str(bench_parquet_path(db)) and r['parquet_seconds'] is not None
    assert {k for k in r if k.endswith('_met')} == {'speed_met', 'memory_met', 'polars_time_met', 'polars_memory_met',
                                                    'clickhouse_polars_time_met', 'clickhouse_polars_memory_met'}
    assert r['clickhouse_database'].startswith(f'risk_{ROWS}_') and r['fastest_engine'] in ('duckdb', 'clickhouse')


def test_a_side_reading_other_data_is_caught(two_datasets):
    "The Parquet copy replaced by one of another dataset, tagged as this one's: polars disagrees, and the run stops."
    db, other = two_datasets
    pq = bench_parquet_path(db)
    tags = ', '.join(f"{k}: '{v}'" for k, v in (_dataset_tags(db) | {'columns': ','.join(PANDAS_COLUMNS)}).items())
    with duckdb.connect(str(other), read_only=True) as con:
        con.execute(f"COPY (SELECT {', '.join(PANDAS_COLUMNS)} FROM transactions) TO '{pq}' "
                    f"(FORMAT parquet, KV_METADATA {{{tags}}})")
    assert ensure_bench_parquet(db)[1] is None  # taken for this dataset's copy
    with pytest.raises(AssertionError, match='the sides DISAGREE on the same data') as e:
        bench_data(rows=ROWS, db=db, repeat=1)
    lines = str(e.value).splitlines()[1:]
    assert lines and all(' vs polars ' in l for l in lines), lines  # pandas reads the DuckDB file: it agrees
    assert any(l.strip().startswith('total_window_cny of ') for l in lines), lines
    pq.unlink()  # the next run writes this dataset's own copy, and the sides agree again
    assert bench_data(rows=ROWS, db=db, repeat=1, sides=('reach', 'polars'))['agree']


def test_a_clickhouse_copy_that_drifted_is_caught(two_datasets):
    "Rows added to the ClickHouse copy behind the tools' back: that side disagrees with DuckDB's, and the run stops."
    db, _ = two_datasets
    name, _ = ensure_clickhouse_copy(db)
    drift = ("import sys; from reach_nb.risk.clickhouse import embedded; t = f'\"{sys.argv[1]}\".transactions'; "
             "embedded().execute(f\"INSERT INTO {t} SELECT * FROM {t} WHERE ts >= '2026-06-24' AND status = 'success' "
             "LIMIT 100\")")
    subprocess.run([sys.executable, '-c', drift, name], check=True, timeout=120)
    with pytest.raises(AssertionError, match='the sides DISAGREE on the same data') as e:
        bench_data(rows=ROWS, db=db, repeat=1, sides=('reach', 'clickhouse'))
    lines = str(e.value).splitlines()[1:]
    assert lines and all(' vs reach_nb on ClickHouse ' in l for l in lines), lines
    assert any(l.strip().startswith('total_window_cny of ') for l in lines), lines
    fix = 'import sys; from reach_nb.risk.clickhouse import copy_to_clickhouse; copy_to_clickhouse(sys.argv[1], force=True)'
    subprocess.run([sys.executable, '-c', fix, str(db)], check=True, timeout=120)
    assert bench_data(rows=ROWS, db=db, repeat=1, sides=('reach', 'clickhouse'))['agree']


def test_without_polars_one_line_says_what_to_install(tmp_path):
    (tmp_path/'polars.py').write_text("raise ModuleNotFoundError(\"No module named 'polars'\", name='polars')\n")
    r = run_reach('bench', 'data', '--rows', str(ROWS), cwd=tmp_path,
                  env=clean_env(PYTHONPATH=str(tmp_path), REACH_DATA_DIR=str(tmp_path/'data')))
    assert r.returncode == 2 and r.stdout.startswith('Benchmarking') and len(r.stdout.splitlines()) == 1, r
    assert r.stderr == "Error: polars is not installed in this Python environment: pip install 'reach_nb[dev]'\n", r.stderr
    assert not (tmp_path/'data').exists()  # said before anything was built
