#!/usr/bin/env bash
# Create the separate verl 0.9.1 venv the verl-export validation tests run in (never miniverl's).
# Installs verl --no-deps plus only what importing its config, dataset and tool modules needs
# (no vLLM, no ray[default]/wandb/tensorboard). Prints the interpreter path on the last line.
# Usage: .ci/verl_venv.sh DIR   (exit 1 when anything cannot be installed)
set -euo pipefail
dir="${1:?usage: verl_venv.sh DIR}"
python3 -m venv "$dir"
"$dir/bin/python" -m pip install --quiet \
    torch==2.13.0 "transformers>=5.5.3,<5.11,!=5.6.0" "tensordict>=0.8.0,<=0.10.0,!=0.9.0" \
    hydra-core "pyarrow>=19" datasets pandas "numpy>=2" codetiming ray pillow pydantic pyyaml
"$dir/bin/python" -m pip install --quiet --no-deps verl==0.9.1
"$dir/bin/python" -c "import verl.utils.config, verl.utils.dataset.rl_dataset, verl.tools.tool_registry"
echo "$dir/bin/python"
