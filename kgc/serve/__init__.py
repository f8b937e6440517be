"""``kgc serve RUN``: a trained run as a long-lived HTTP service (FastAPI + uvicorn).

The server is task-blind: the run's task hands it a :class:`kgc.training.routes.Serving` with its routes
(link prediction: ``POST /predict``, ``GET|POST /entities``, ``GET /relations``; C-STS: ``POST /similarity``) and
its page. The server adds

* ``GET /health`` — 200 ``{"status": "ready"}`` once the model and index are loaded (503 ``loading`` before;
  503 ``error`` with the message when loading failed);
* ``GET /info`` — run, task, dataset, conditioner, device, the test metrics of ``results.json``, batching counts;
* ``POST /explain`` — what ``kgc explain`` computes (a router's weight per token of a sentence under each condition,
  Hyper-CL's spectra); its body is the task's (:meth:`kgc.training.task.Task.explain_request`);
* ``GET /`` — the task's page; ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) — the OpenAPI pages, their scripts and
  styles served from the package (``kgc/static/apidocs``, with their licences), so they work offline.

Errors are JSON: a malformed body 422 (FastAPI's validation), an unknown name 404 with ``suggestions`` (and
``valid`` names for a relation), a run another writer holds 409, other bad input 400, the model still loading
503, and anything unexpected 500 — logged with its traceback, and the server keeps serving.

The package, one concern a file: :mod:`~kgc.serve.limits` (what a server takes and how long it waits),
:mod:`~kgc.serve.guard` (uvicorn's h11 protocol with the caps an ASGI middleware cannot see),
:mod:`~kgc.serve.middleware` (Host headers, bodies and requests in flight), :mod:`~kgc.serve.apidocs` (the
OpenAPI pages, offline), :mod:`~kgc.serve.app` (the FastAPI app of a run) and :mod:`~kgc.serve.listen` (uvicorn's
configuration and the process's life: signals, exit codes).
"""

from __future__ import annotations

from kgc.serve.app import create_app
from kgc.serve.guard import guarded_protocol
from kgc.serve.limits import DEFAULT_MAX_BATCH, DEFAULT_MAX_WAIT_MS, Limits, ServeOptions
from kgc.serve.listen import serve, uvicorn_config
from kgc.serve.middleware import LOOPBACK_NAMES, _LimitBodies, _TrustedHosts, trusted_hosts_for

__all__ = ["DEFAULT_MAX_BATCH", "DEFAULT_MAX_WAIT_MS", "LOOPBACK_NAMES", "Limits", "ServeOptions", "_LimitBodies", "_TrustedHosts",
           "create_app", "guarded_protocol", "serve", "trusted_hosts_for", "uvicorn_config"]
