"""The lakehouse platform's domain package."""

from lakehouse.runtime.startup import arm_fast_exit

# registered first, so that it runs after every other exit handler (lakehouse.runtime.startup)
arm_fast_exit()
