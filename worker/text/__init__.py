"""Token ids to what a client sees: incremental detokenizing, stop strings, logprob entries, a choice's text and
reports."""
