#!/usr/bin/env bash
# The checks that need a CUDA GPU, as one prepared run (CI has no GPU; these skip there).
#
#   tools/gpu-check.sh --fetch   here, once: wheels of goodput's needs that a GPU image may lack
#                                (msgspec, crc32c) into .whl/, which git ignores
#   bash tools/gpu-check.sh      on the GPU machine, from the repository root: installs .whl/ into
#                                /tmp/site, then runs the CUDA tests and the staging benchmark
#
# The CUDA tests: pinned staging on a side stream (save), cudaHostRegister of the async staging
# segment (both writer modes), CUDA load targets through the bounded pinned buffer (contiguous,
# transposed, shards); eager and lazy staging of CUDA tensors (test_async_staging's CUDA cases).
# The benchmark: `goodput bench async`, whose CUDA part measures
# device-to-host staging against the PCIe link (goal >= 80 %).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--fetch" ]]; then
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl msgspec crc32c
  grep -qx '/.whl/' .git/info/exclude || echo '/.whl/' >> .git/info/exclude
  exit 0
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD"
fi
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA'; print(torch.__version__, torch.cuda.get_device_name())"
python3 -m pytest -q -p no:cacheprovider -rs tests/ckpt/test_cuda.py tests/ckpt/saving/test_async_staging.py
python3 -m goodput.cli.main bench async --size "${GPU_CHECK_SIZE:-4GiB}" --repeat 2 --loop-steps 100
