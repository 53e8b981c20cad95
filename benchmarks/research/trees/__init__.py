"""Do tree rollouts learn a decision faster than chains at an equal budget of policy tokens (issues 41, 49)?"""
