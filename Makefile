# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
TORCH_VERSION := 2.13.0
INSTALLED := $(VENV)/.installed

.PHONY: setup model draft-model sae demo serve test lint gpu-check gpu-bundle

setup: $(INSTALLED) model sae

# torch goes in first and pinned: an unpinned torch pulls gigabytes of CUDA wheels on a CPU machine.
# A GPU machine may install its CUDA build of torch $(TORCH_VERSION) into .venv beforehand; it is kept.
$(INSTALLED): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$(TORCH_VERSION)')" 2>/dev/null \
		|| $(PY) -m pip install -q torch==$(TORCH_VERSION)
	# the gptq extra: GPTQ and AWQ served and tested on CPU (pyproject.toml says what it builds and pins); every
	# version as constraints.txt pins it, so a fresh machine gets what the suite last passed with
	$(PY) -m pip install -q -c constraints.txt -e ".[dev,gptq]"
	touch $(INSTALLED)

model: $(INSTALLED)
	$(PY) -m scripts.build_tiny_model --out models/tiny

# A 1-layer model with the tiny model's tokenizer: the draft for speculative decoding (bench/features/speculation.py).
draft-model: model
	$(PY) -m scripts.build_tiny_model --out models/tiny-draft --num-layers 1 --tokenizer-from models/tiny

# A small SAE for the tiny model (SAELens format), listed by default from models/saes.
sae: model
	$(PY) -m scripts.build_tiny_sae --model models/tiny --out models/saes/tiny/resid_post_2

demo: setup
	$(PY) -m scripts.demo

serve: setup
	exec $(PY) -m scripts.serve

# Three processes, a module each at a time (module-scoped stacks stay in one process): much of the suite waits on its
# stacks' processes, so even on two cores a third process fills time the other two leave idle (on a 2-core AMD EPYC:
# 13 min 37 s with two, 11 min 54 s with three; the suite's tests hold on a machine this busy).
TEST_PROCESSES ?= 3
test: setup
	$(PY) -m pytest -q -n $(TEST_PROCESSES) --dist loadscope

lint: $(INSTALLED)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The GPU check (scripts/gpu/check.py): on the lent CUDA machine (no network, no .venv) from the source tree and the
# bundle, its report (report.md, report.json and the benchmarks' tables) in GPU_OUT. DEVICE=cpu runs the same sequence
# here at the smallest sizes, with .venv's interpreter. GPU_PYTHON is the interpreter holding the CUDA build of torch.
DEVICE ?= cuda
GPU_BUNDLE ?= gpu-bundle
GPU_OUT ?= gpu-check
GPU_PYTHON ?= $(if $(filter cpu,$(DEVICE)),$(PY),python3)
gpu-check:
	PYTHON=$(GPU_PYTHON) scripts/gpu/check.sh $(GPU_OUT) $(GPU_BUNDLE) $(DEVICE)

# The folder a GPU call carries (at most 48 MiB): the service's wheels for Python 3.12 and the tiny model with its SAE.
gpu-bundle: $(INSTALLED) model sae
	$(PY) -m scripts.gpu.bundle --out $(GPU_BUNDLE)
