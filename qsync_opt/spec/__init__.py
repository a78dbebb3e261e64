"""Spec core shared by every problem kind: the base model, YAML loading, error messages that
name the field and line, and finding user code beside the spec. Nothing here knows a kind."""
