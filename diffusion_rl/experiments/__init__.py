"""ShapesWorld studies built on the library, not part of it: each is a script with `main(argv)`.

    python -m diffusion_rl.experiments.shapesworld ...       # ReNO and best-of-N against the exact checker
    python -m diffusion_rl.experiments.adversarial_pool ...  # checker-labelled ReNO iterates (reward data)
    python -m diffusion_rl.experiments.harden_clip ...       # builds assets/shapesworld/clip-hardened
"""
