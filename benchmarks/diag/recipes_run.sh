set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=.:/tmp/site
python3 benchmarks/demo_recipes.py --jobs 8 --threads 2 --seeds 0 1 2 3 "$@" | tee $OUT/recipes.jsonl
