"""Chat and completions: their blueprints, bodies, prompts, sampling, completion objects, and the generation path they
share; tokenize and /v1/requests too."""
