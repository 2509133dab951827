"""The recommendation service: HTTP API, candidate retrieval, ONNX scoring, hot swap.

``create_app(settings)`` (:mod:`app.main`) builds the FastAPI application;
``vidrec up`` / ``vidrec serve`` (:mod:`app.server`) run it. This package
never imports ``trainer`` (the embedded trainer comes through its entry
point), so serving never imports torch.
"""
