"""Structured outputs and tools: the body fields, the grammar a request asks for, its checks, and a chat request's tool
plan."""
