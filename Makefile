# kgc — make install | quickstart | test | docs
# torch==2.13.0 (a CPU build) is installed first on purpose: an unpinned torch pulls GBs of CUDA wheels.
# On a GPU machine, install the CUDA torch you want first, then `make install TORCH=`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
# the shared benchmark copies beside the checkout, when present (UMLS falls back to pykeen's bundled copy)
KGC_DATA_HOME ?= $(abspath ../shared/data)
export KGC_DATA_HOME

.PHONY: install quickstart test test-heavy test-wheel test-rehearsal test-faults test-durations docs docs-serve clean gpu-bundle gpu-rehearse study-umls study-umls-tuned study-csts-tuned study-routing wn18rr-cpu study-wn18rr-table study-wn18rr-pace study-wn18rr-precision study-wn18rr-figure bench-grail

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(if $(TORCH),$(BIN)/pip install -q $(TORCH))
	$(BIN)/pip install -q -e '.[test,docs]'
	touch $@

# train the bi-encoder on UMLS from the bundled all-MiniLM-L6-v2, then print test MRR / Hits@k
quickstart: install
	rm -rf runs/quickstart
	$(BIN)/kgc train recipes/umls_biencoder.yaml --out runs/quickstart
	$(BIN)/kgc evaluate runs/quickstart

# the layer contract first (pyproject.toml [tool.importlinter]: an upward import or an import circle fails);
# pytest exit code 5 ("no tests ran") is a failure too. Two workers (pytest-xdist), a test file each at a time so a
# file's shared trained runs are built once, the longest files first (tests/durations.json); tests/conftest.py gives
# each worker one torch thread (12.5 -> 7.0 min)
TEST_WORKERS ?= 2
PYTEST_XDIST = -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
# after pytest: its exit code, but 5 ("no tests ran") is a failure
COLLECTED = rc=$$?; if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests" >&2; exit 1; fi; exit $$rc
# the suite but the GPU job's CPU rehearsal (marked rehearsal, every phase, ~5.5 min: `make test-rehearsal`) and the
# heavy checks (`make test-heavy`); .ci/run runs all three
test: install
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q $(PYTEST_XDIST) -m "not rehearsal and not heavy"; $(COLLECTED)

# the heavy checks `make test` leaves out (tests/conftest.py HEAVY: killed and resumed processes, process groups,
# many-trial studies, learning outcomes; about 10 minutes); .ci/run runs them after `make test`
test-heavy: install
	$(BIN)/python -m pytest -q $(PYTEST_XDIST) -m "heavy and not rehearsal"; $(COLLECTED)

# kgc as its users get it: the wheel built from this tree into a fresh venv (torch==2.13.0 first), then the README's
# commands from an empty folder — recipes and examples from the wheel (.ci/wheel-test.sh; about 3 minutes, most of it
# pip); .ci/run runs it
test-wheel: install
	PY=$(BIN)/python TORCH=$(TORCH) bash .ci/wheel-test.sh

test-rehearsal: install
	$(BIN)/python -m pytest -q -m rehearsal tests/test_gpu_job.py; $(COLLECTED)

# the fault matrix in full (tests/test_fault_matrix.py): every command that writes a run, a full disk at each of its
# writes and a kill at each, then the next command (the suite runs one point of each)
test-faults: install
	KGC_FAULT_SWEEP=full $(BIN)/python -m pytest -q tests/test_fault_matrix.py; $(COLLECTED)

# the suite once more, writing each test file's seconds to tests/durations.json (the order `make test` starts them in)
test-durations: install
	KGC_TEST_DURATIONS=tests/durations.json $(BIN)/python -m pytest -q $(PYTEST_XDIST) -m "not rehearsal and not heavy"

# The documentation site (mkdocs.yml, docs/): built into site/ with --strict, as .ci/run builds it (a broken link or
# anchor, a missing page, an unknown name in an API reference fails); docs-serve rebuilds on change, on 127.0.0.1 only
# (port 8001: kgc serve's default is 8000).
DOCS_ADDR ?= 127.0.0.1:8001
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr $(DOCS_ADDR)

# The UMLS measurements behind the router and Hyper-CL recipes (docs/results/umls-router-study.md):
# one epoch each, 2 CPU cores, ~30 min in all; every row is a `kgc compare` of one recipe with --set.
STUDY ?= runs/umls_study
study-umls: install
	set -e; run() { n=$$1; shift; $(BIN)/kgc compare "$$@" --set name=$$n --no-progress --out $(STUDY)/$$n; }; \
	CSR="recipes/umls_csr_top2.yaml --set model.router_layers=1 --set model.cross_attend=none"; \
	HRES="recipes/umls_hypercl_residual.yaml --set train.conditioner_lr=null"; \
	LONG="--set data.long_text=true --set data.max_tokens=48"; \
	run csr_k1 $$CSR; \
	run csr_k2 $$CSR --set model.router_layers=2; \
	run csr_top_k1 $$CSR --set model.cross_attend=top; \
	run csr_top_k2 $$CSR --set model.cross_attend=top --set model.router_layers=2; \
	run csr_top_k3 $$CSR --set model.cross_attend=top --set model.router_layers=3 --set encoder.trainable_layers=3; \
	run csr_top_k1_cls $$CSR --set model.cross_attend=top --set model.scorer=cls_attention; \
	run csr_top_k2_heavy_lr $$CSR --set model.cross_attend=top --set model.router_layers=2 \
	    --set model.scorer=heavy --set train.conditioner_lr=3e-3; \
	run csr_k1_long $$CSR $$LONG; \
	run csr_top_k2_long $$CSR $$LONG --set model.cross_attend=top --set model.router_layers=2; \
	run hyper_res $$HRES; \
	run hyper_res_lr $$HRES --set train.conditioner_lr=3e-3; \
	run hyper_res_long $$HRES $$LONG; \
	run biencoder_csr1 recipes/umls_biencoder.yaml --set model.router_layers=1
	head -n 2 $(STUDY)/csr_k1/compare.md; for d in $(STUDY)/*/; do tail -n 1 $$d/compare.md; done

# A fair table (issue 41): each recipe tuned by `kgc tune` at the same trials and per-trial budget (2 validations a
# trial, median pruning), then each best.yaml trained at its recipe's own budget and tested by one `kgc compare`; a
# study already finished is not run again. $(call tuned-study,FOLDER,RECIPE PREFIX,NAMES,BUDGET)
define tuned-study
set -e; for r in $(3); do \
  test -f $(1)/tune-$$r/trials.md || $(BIN)/kgc tune recipes/$(2)$$r.yaml --trials 6 \
    --set 'tune.budget=$(4)' --set tune.reports=2 --set tune.pruner=median --out $(1)/tune-$$r; \
done; \
$(BIN)/kgc compare $(foreach r,$(3),$(1)/tune-$(r)/best.yaml) --no-progress --out $(1)/compare
endef

# UMLS: 6 trials of 5,248 triple-directions (half the recipes' epoch)
TUNED ?= runs/umls_tuned
TUNED_RECIPES ?= csr_top2 csr hypercl hypercl_residual concat hadamard biencoder
study-umls-tuned: install
	$(call tuned-study,$(TUNED),umls_,$(TUNED_RECIPES),5248 triples)

# The synthetic C-STS set: 6 trials of 6,000 pairs (half the bi-encoder recipe's 3 epochs), the shipped space (lr,
# the contrastive τ where the recipe has the term, the conditioner's own lr); ~85 min on 2 cores, beside other work
TUNED_CSTS ?= runs/csts_tuned
TUNED_CSTS_RECIPES ?= biencoder case concat csr hadamard hypercl hypercl_s2sent
study-csts-tuned: install
	$(call tuned-study,$(TUNED_CSTS),csts_synth_,$(TUNED_CSTS_RECIPES),6000 pairs)

# docs/results/routing.md ("A router that routes"): the router rows of the UMLS study and the C-STS router rows with
# the routing defaults (the paper's q^c, w over words, values × (1 + w − 1/n)); one `kgc compare` per row, ~25 min on 2 cores.
ROUTING ?= runs/routing_study
study-routing: install
	set -e; run() { n=$$1; shift; $(BIN)/kgc compare "$$@" --set name=$$n --no-progress --out $(ROUTING)/$$n; }; \
	NEW="--set model.scorer=paper --set model.route_over=words --set model.route_scales=values --set model.weighting=centred"; \
	CSR="recipes/umls_csr_top2.yaml --set model.router_layers=1 --set model.cross_attend=none $$NEW"; \
	run csr_k1 $$CSR; \
	run csr_top_k2 $$CSR --set model.cross_attend=top --set model.router_layers=2; \
	run csr_top_k3 recipes/umls_csr.yaml $$NEW; \
	run csts_synth_csr recipes/csts_synth_csr.yaml; \
	run csts_synth_csr_top2 recipes/csts_synth_csr.yaml --set model.cross_attend=top --set model.router_layers=2
	for d in $(ROUTING)/*/; do if [ -f $$d/compare.md ]; then tail -n 1 $$d/compare.md; fi; done

# Issue 27's WN18RR table (docs/results/wn18rr.md, "Conditioners at the laptop training"): every conditioner trained
# as recipes/wn18rr_laptop.yaml trains (frozen tail table, top 4 query layers over the layer cache, batch 64) for the
# same 1,563 steps = 100,032 training triple-directions, then the full filtered test evaluation (both directions,
# 5-hop re-ranking). One `kgc compare` per row, run alone (~35 min each on 2 cores):
# `make study-wn18rr-table ROWS="biencoder router_k1_paper"` runs some of them.
TABLE ?= runs/wn18rr_table
ROWS ?= biencoder router_k1_paper router_k1_query_key router_top2 hypercl_lowrank hypercl_residual hadamard concat case
# the --set options of each row
TABLE_OPTS = case $$row in \
	    biencoder) opts="";; \
	    router_k1_paper) opts="--set model.conditioner=router --set model.router_layers=1";; \
	    router_k1_query_key) opts="--set model.conditioner=router --set model.router_layers=1 --set model.scorer=query_key";; \
	    router_top2) opts="--set model.conditioner=router --set model.router_layers=2 --set model.cross_attend=top";; \
	    hypercl_lowrank) opts="--set model.conditioner=hypernet --set model.hypernet_form=lowrank";; \
	    hypercl_residual) opts="--set model.conditioner=hypernet --set model.hypernet_form=residual";; \
	    hadamard) opts="--set model.conditioner=hadamard";; \
	    concat) opts="--set model.conditioner=concat";; \
	    case) opts="--set model.conditioner=case";; \
	    *) echo "unknown row $$row" >&2; exit 2;; \
	  esac
study-wn18rr-table: install
	set -e; BUDGET="--set train.max_steps=1563 --set train.max_minutes=null"; \
	for row in $(ROWS); do \
	  $(TABLE_OPTS); \
	  $(BIN)/kgc compare recipes/wn18rr_laptop.yaml $$BUDGET $$opts --set name=$$row --no-progress --out $(TABLE)/$$row; \
	done
	for d in $(TABLE)/*/; do if [ -f $$d/compare.md ]; then tail -n 1 $$d/compare.md; fi; done

# each row's training pace alone on an idle machine (the table's triples/s column): `kgc bench train --no-full`,
# 20 timed steps of 64 after 20 that fill the layer cache, into $(TABLE)/<row>/pace.json (~4 min a row)
study-wn18rr-pace: install
	set -e; for row in $(ROWS); do \
	  $(TABLE_OPTS); mkdir -p $(TABLE)/$$row; \
	  $(BIN)/kgc bench train recipes/wn18rr_laptop.yaml --no-full --trainable-layers 4 --batch-size 64 --steps 20 \
	    $$opts --out $(TABLE)/$$row/pace.json; \
	done

# each row's fp32 and bf16 paces side by side in one process, alternating (the table's bf16 column): `kgc bench
# precision`, 2 x 4 timed steps of 64 each way, queries answered/s each way, into $(TABLE)/<row>/precision.json
# (~4 min a row alone; on a CPU without bf16 hardware only fp32 is timed)
study-wn18rr-precision: install
	set -e; for row in $(ROWS); do \
	  $(TABLE_OPTS); mkdir -p $(TABLE)/$$row; \
	  $(BIN)/kgc bench precision recipes/wn18rr_laptop.yaml --steps 4 --rounds 2 $$opts --out $(TABLE)/$$row/precision.json; \
	done

# every row's dev curve in one figure (by triples seen and by training minutes), from the rows trained so far
study-wn18rr-figure: install
	set -e; runs=""; for row in $(ROWS); do \
	  if [ -f $(TABLE)/$$row/$$row/metrics.jsonl ]; then runs="$$runs $(TABLE)/$$row/$$row"; fi; \
	done; \
	if [ -z "$$runs" ]; then echo "no row of $(TABLE) has trained yet: make study-wn18rr-table first" >&2; exit 2; fi; \
	$(BIN)/kgc curves $$runs --out $(TABLE)/curves.png

# GraIL's eight inductive splits (docs/results/inductive.md): each trained on its training graph (~10 minutes on 2 CPU
# cores), its inference graph ranked both ways (every entity; 50 candidates) beside PageRank, rules and text + rules;
# one table in runs/grail/inductive.md (a finished split is reused: run it again after a stop)
GRAIL = runs/grail
bench-grail: install
	$(BIN)/kgc bench grail recipes/grail_wn18rr.yaml --runs $(GRAIL) --out $(GRAIL)/wn18rr.json
	$(BIN)/kgc bench grail recipes/grail_fb237.yaml --runs $(GRAIL) --out $(GRAIL)/fb237.json

clean:
	rm -rf $(VENV) runs .pytest_cache site

# The GPU job (docs/gpu.md). gpu-bundle packs what travels with it besides the tree into gpu/bundle (wheels of what
# the GPU image lacks, MiniLM in fp16, the datasets) and prints the size against the device tool's 64 MiB;
# gpu-rehearse runs gpu/run.sh on this CPU as it runs there: an environment of the image's packages, a clean copy of
# the tree, $OUT, a tiny random BERT (REHEARSE="--phases environment,smoke" to run fewer phases).
gpu-bundle: install
	$(BIN)/python gpu/bundle.py

REHEARSE ?=
gpu-rehearse: install
	test -f gpu/bundle/manifest.json || $(BIN)/python gpu/bundle.py
	$(BIN)/python gpu/rehearse.py $(REHEARSE)
