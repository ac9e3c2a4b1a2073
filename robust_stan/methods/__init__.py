"""Inference methods. Each method family has its own folder (``rob_ula/``, ``coresets/``, ``dpvi/``,
``variational/``, ``selection/``); the modules at this level serve several families: NUTS, Stan's
own approximations, the Laplace approximation, importance sampling, the mode census, the held-out
log predictive density of a fit's draws, and the placement of rows held in partitions."""
