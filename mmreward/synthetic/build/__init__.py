"""Scripts that train and build the ShapesWorld assets (CLIP, generator, preference and aesthetic heads, the
checker-labelled generator pools). Nothing at runtime imports this package: the rewards load the finished
folders under assets/shapesworld, and their model definitions live in mmreward.synthetic.models.

    python -m mmreward.synthetic.build.build_assets --quick --root /tmp/sw   # a 1-minute smoke build
"""
