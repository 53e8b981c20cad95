"""Does a risk head know when the policy will be wrong, and does it beat the baselines that need none?"""
