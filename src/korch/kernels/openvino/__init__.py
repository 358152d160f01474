"""OpenVINO as a library backend (Note [OpenVINO as a library] in backend.py)."""
