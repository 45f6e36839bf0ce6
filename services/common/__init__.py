"""Plumbing shared by every service: config, logging, metrics, errors, gRPC server and channels."""
