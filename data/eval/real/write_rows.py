"""Write an evaluation's rows as JSON lines, as the files beside this one were written.

    python data/eval/real/write_rows.py OUT/results.duckdb data/eval/real/NAME.jsonl [--ablation]

The results file is copied first, so an evaluation still running keeps its own. Each row is `Results.rows`' dict
without the run key, the trace path and the task hash; with `--ablation`, only the ablation grid's rows."""
import json, shutil, sys, tempfile
from pathlib import Path

from reach_nb.eval import Results

if __name__ == '__main__':
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    tmp = Path(tempfile.mkdtemp())
    for f in src.parent.glob(src.name + '*'): shutil.copy(f, tmp/f.name)
    with Results(tmp/src.name) as r: rows = r.rows()
    if '--ablation' in sys.argv: rows = [r for r in rows if r['config'].startswith('ablation · ')]
    drop = {'key', 'trace', 'task_hash'}
    with dst.open('w', encoding='utf-8') as f:
        for row in rows:
            f.write(json.dumps({k: v for k, v in row.items() if k not in drop}, ensure_ascii=False, sort_keys=True) + '\n')
    print(f"{len(rows)} rows written to {dst}")
