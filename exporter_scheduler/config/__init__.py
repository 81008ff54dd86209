"""Configuration: the policy's settings, the policy file and tenant profiles.

All of it is checked at start-up, so a bad setting stops the scorer with a message naming it.
"""
