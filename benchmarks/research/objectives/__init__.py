"""Which objective (loss variant) learns most on the quickstart workload, and what each mechanism acts on?"""
