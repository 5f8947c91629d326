# The two commands that matter:  `make demo` (three-arm demo)  and  `make test` (test suite).
# Both create or reuse .venv through tools/setup_env.sh, which installs everything needed.
PY := .venv/bin/python
DEMO_CONFIG ?= configs/demo/mask_rcnn_vit_tiny.py
DEMO_OUTPUT ?= output/demo
PYTEST_ARGS ?=

.PHONY: venv lint format test test-e2e test-fast demo demo-pretrain demo-paper gpu-check

venv:
	bash tools/setup_env.sh

# ruff with the project's rules (ruff.toml): the lint, and the layout as `ruff format` writes it (Python files and the
# Python fences of the Markdown pages); the tests run it first. `make format` rewrites the layout.
lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: venv
	$(PY) -m ruff format .

# Both cores (pytest-xdist): each test file, the Slurm tests and the wheelhouse builds are one group on one worker
# (tests/conftest.py). TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2
XDIST := $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup)

test: lint
	$(PY) -m pytest -q -p no:cacheprovider --durations=25 -m "not e2e" $(XDIST) $(PYTEST_ARGS)

# The whole-system runs (marker e2e): every config end to end, the installed wheel, the offline install, Slurm jobs,
# several processes, kills, the documented demo commands. CI (.ci/run) runs them after `make test`. Their groups go
# out in the order tests/conftest.py gives them (pytest-xdist would order them by their number of tests).
test-e2e: venv
	$(PY) -m pytest -q -p no:cacheprovider --durations=25 -m e2e $(XDIST) $(if $(XDIST),--no-loadscope-reorder) \
		$(PYTEST_ARGS)

test-fast: lint
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow" $(XDIST) $(PYTEST_ARGS)

demo: venv
	$(PY) tools/train_net.py --config-file $(DEMO_CONFIG) --arm all --bootstrap 1000 train.output_dir=$(DEMO_OUTPUT)

demo-pretrain: venv
	$(PY) tools/pretrain_net.py --config-file configs/demo/pretrain_vit_tiny.py --arm all train.output_dir=output/demo_pretrain

# The paper's protocol at CPU size: pretrain a tiny ViT per arm, fine-tune the Mask R-CNN demo per arm from
# that arm's backbone, then one report of both stages.
demo-paper: venv
	$(PY) tools/pretrain_net.py --config-file configs/demo/pretrain_vit_tiny.py --arm all train.output_dir=output/demo_paper/pretrain
	$(PY) tools/train_net.py --config-file configs/demo/mask_rcnn_vit_tiny_finetune.py --arm all train.output_dir=output/demo_paper/finetune
	$(PY) tools/compare_arms.py output/demo_paper/pretrain output/demo_paper/finetune --output output/demo_paper/report

# The same protocol on real handwritten digits (the UCI digits scikit-learn ships: embedded digits-cls, then
# digits-det scenes): the paper's three arms and the scale-matched control, each fine-tuned from its own
# backbone, then one report of both stages. SEEDS=0,1,2 for three seeds.
SEEDS ?= 0
DIGITS_OUTPUT ?= output/demo_digits
.PHONY: demo-digits
demo-digits: venv
	$(PY) tools/pretrain_net.py --config-file configs/demo/pretrain_vit_tiny_digits.py --arm all,scale_matched \
		--seeds $(SEEDS) train.output_dir=$(DIGITS_OUTPUT)/pretrain
	$(PY) tools/train_net.py --config-file configs/demo/mask_rcnn_vit_tiny_digits_finetune.py --arm all,scale_matched \
		--seeds $(SEEDS) train.output_dir=$(DIGITS_OUTPUT)/finetune \
		"train.init_checkpoint='$(DIGITS_OUTPUT)/pretrain/{arm}/seed{seed}'"
	$(PY) tools/compare_arms.py $(DIGITS_OUTPUT)/pretrain $(DIGITS_OUTPUT)/finetune --output $(DIGITS_OUTPUT)/report

# On a machine with a CUDA device: the tests marked gpu and the init-cost bench on the GPU (ViTDet-B/L/H),
# one verdict line per check, about 10 minutes (docs/development.md: the GPU check).
gpu-check: venv
	$(PY) tools/gpu_check.py

# Every dependency but torch/torchvision as wheels in $(WHEELHOUSE), for `bash tools/setup_env.sh --offline DIR`
# on a machine without network (docs/install.md); e.g. WHEELHOUSE_ARGS="--python-version 3.12 --platform
# manylinux_2_28_x86_64".
WHEELHOUSE ?= wheelhouse
WHEELHOUSE_ARGS ?=
.PHONY: wheelhouse
wheelhouse: venv
	PYTHON=$(PY) bash tools/wheelhouse.sh $(WHEELHOUSE) $(WHEELHOUSE_ARGS)
