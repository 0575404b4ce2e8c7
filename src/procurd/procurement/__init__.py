"""Procurement: the pure state machine and the services that apply it."""
