"""The lakehouse platform's domain package."""

from lakehouse.startup import arm_fast_exit

# registered first, so that it runs after every other exit handler (lakehouse.startup)
arm_fast_exit()
